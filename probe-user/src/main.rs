//! The `workerprobe` binary: parse, run, report errors as one sentence.

use std::process::ExitCode;

use clap::Parser as _;
use workerprobe::{
    app,
    cli::{Cli, Command},
    error::UserError,
};

fn main() -> ExitCode {
    // Fixed thresholds: glibc's adaptive ones rise after the first large free, after which
    // a burst's large buffers come from the heap and its freed pages stay with the process.
    // SAFETY: mallopt only sets the allocator's parameters, before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
    // Bad flags and values: clap prints the reason and exits with 2.
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            match err.downcast_ref::<UserError>() {
                Some(user_error) => {
                    workerprobe::say!("Error: {user_error}");
                    // Bad input exits like a bad flag; a machine problem with 1.
                    if user_error.is_bad_input() {
                        return ExitCode::from(2);
                    }
                }
                None => workerprobe::say!("Error: {err:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; returns the exit code (a command's own for `exec`).
fn run(cli: Cli) -> anyhow::Result<u8> {
    match &cli.command {
        Command::Exec(args) => return app::exec::exec(args),
        Command::Check(args) => return app::check::check(args),
        _ => {}
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match &cli.command {
            Command::Top(args) => app::top(args).await,
            Command::Snapshot(args) => app::snapshot(args).await,
            Command::Watch(args) => app::watch::watch(args).await,
            Command::Serve(args) => app::serve::serve(args).await,
            Command::Record(args) => app::record::record(args).await,
            Command::Replay(args) => app::replay::replay(args),
            Command::Plot(args) => app::plot::plot(args),
            Command::Trace(args) => app::trace::trace(args),
            Command::Report(args) => app::report::report(args),
            Command::Merge(args) => app::merge::merge(args),
            Command::Unpin(args) => app::unpin::unpin(args),
            Command::Exec(_) | Command::Check(_) => Ok(()),
        }
    })?;
    Ok(0)
}
