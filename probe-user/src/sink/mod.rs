//! Sinks: turn an [`Interval`](crate::model::Interval) into something a person or a program
//! reads. Sinks never reach back into collection.

pub mod json;
pub mod picture;
pub mod process;
pub mod prometheus;
pub mod summary;
pub mod table;
pub mod tui;
