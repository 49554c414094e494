//! A reader of the kernel's BTF that indexes it in place: one pass records where each type
//! starts and which ids bear each name, and every lookup reads the bytes as they lie.
//!
//! The agent asks the BTF a few dozen questions (member offsets, tracepoint prototypes,
//! function parameters) once per start. btf-rs answers them from a full decode of every type
//! and string, which took about 100 ms here and 20–40 ms more to free: the largest part of the
//! agent's start after the verifier. This index takes a few milliseconds and borrows the bytes.
//! (aya-obj parses BTF too, for loading, but keeps its types private.)

use std::collections::HashMap;

/// Why the bytes are not BTF this reader can use.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// Not BTF, or BTF of the other byte order.
    #[error("not little-endian BTF")]
    NotBtf,
    /// A section or a type runs past the end of the bytes.
    #[error("BTF truncated")]
    Truncated,
    /// A type kind newer than this reader: the types after it cannot be found.
    #[error("BTF type kind {0} unknown")]
    UnknownKind(u32),
}

/// A BTF type's kind (`BTF_KIND_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `BTF_KIND_INT`.
    Int,
    /// `BTF_KIND_PTR`.
    Ptr,
    /// `BTF_KIND_ARRAY`.
    Array,
    /// `BTF_KIND_STRUCT`.
    Struct,
    /// `BTF_KIND_UNION`.
    Union,
    /// `BTF_KIND_ENUM`.
    Enum,
    /// `BTF_KIND_FWD`.
    Fwd,
    /// `BTF_KIND_TYPEDEF`.
    Typedef,
    /// `BTF_KIND_VOLATILE`.
    Volatile,
    /// `BTF_KIND_CONST`.
    Const,
    /// `BTF_KIND_RESTRICT`.
    Restrict,
    /// `BTF_KIND_FUNC`.
    Func,
    /// `BTF_KIND_FUNC_PROTO`.
    FuncProto,
    /// `BTF_KIND_VAR`.
    Var,
    /// `BTF_KIND_DATASEC`.
    Datasec,
    /// `BTF_KIND_FLOAT`.
    Float,
    /// `BTF_KIND_DECL_TAG`.
    DeclTag,
    /// `BTF_KIND_TYPE_TAG`.
    TypeTag,
    /// `BTF_KIND_ENUM64`.
    Enum64,
}

impl Kind {
    /// The kind numbered `number`, and how many bytes follow its common header for `vlen`.
    fn of(number: u32, vlen: usize) -> Result<(Kind, usize), BtfError> {
        Ok(match number {
            1 => (Kind::Int, 4),
            2 => (Kind::Ptr, 0),
            3 => (Kind::Array, 12),
            4 => (Kind::Struct, 12 * vlen),
            5 => (Kind::Union, 12 * vlen),
            6 => (Kind::Enum, 8 * vlen),
            7 => (Kind::Fwd, 0),
            8 => (Kind::Typedef, 0),
            9 => (Kind::Volatile, 0),
            10 => (Kind::Const, 0),
            11 => (Kind::Restrict, 0),
            12 => (Kind::Func, 0),
            13 => (Kind::FuncProto, 8 * vlen),
            14 => (Kind::Var, 4),
            15 => (Kind::Datasec, 12 * vlen),
            16 => (Kind::Float, 0),
            17 => (Kind::DeclTag, 4),
            18 => (Kind::TypeTag, 0),
            19 => (Kind::Enum64, 12 * vlen),
            other => return Err(BtfError::UnknownKind(other)),
        })
    }
}

/// `struct btf_type`'s size: name offset, info, size or type.
const TYPE_HEADER_BYTES: usize = 12;

/// The kernel's BTF, indexed.
pub struct BtfReader<'a> {
    /// The type section.
    types: &'a [u8],
    /// The string section.
    strings: &'a [u8],
    /// Where type `id` starts in `types` (id 0, void, has none: its entry is unused).
    starts: Vec<u32>,
    /// Each name's highest id (foldhash: SipHash over a kernel's 100k+ names was a few ms of
    /// the agent's start).
    last_named: HashMap<&'a [u8], u32, foldhash::fast::FixedState>,
    /// For each id, the next lower id of the same name (0: none).
    earlier_named: Vec<u32>,
}

impl<'a> BtfReader<'a> {
    /// Indexes `bytes`, a whole BTF blob such as `/sys/kernel/btf/vmlinux`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BtfError> {
        if u16_at(bytes, 0) != Some(0xeb9f) {
            return Err(BtfError::NotBtf);
        }
        let header = |at| {
            u32_at(bytes, at)
                .map(|v| v as usize)
                .ok_or(BtfError::Truncated)
        };
        let header_len = header(4)?;
        let section = |offset: usize, len: usize| {
            let start = header_len + offset;
            bytes.get(start..start + len).ok_or(BtfError::Truncated)
        };
        let types = section(header(8)?, header(12)?)?;
        let strings = section(header(16)?, header(20)?)?;
        let mut reader = BtfReader {
            types,
            strings,
            starts: vec![0],
            // Room for every distinct name at once (6.18's vmlinux: 73k in 3.2 MB of types).
            last_named: HashMap::with_capacity_and_hasher(
                types.len() / 40,
                foldhash::fast::FixedState::default(),
            ),
            earlier_named: vec![0],
        };
        let mut at = 0;
        while at < types.len() {
            let id = reader.starts.len() as u32;
            let name_offset = u32_at(types, at).ok_or(BtfError::Truncated)?;
            let info = u32_at(types, at + 4).ok_or(BtfError::Truncated)?;
            let (_, extra) = Kind::of((info >> 24) & 0x1f, (info & 0xffff) as usize)?;
            reader.starts.push(at as u32);
            let earlier = match reader.string(name_offset) {
                Some(name) if !name.is_empty() => reader.last_named.insert(name, id).unwrap_or(0),
                _ => 0,
            };
            reader.earlier_named.push(earlier);
            at += TYPE_HEADER_BYTES + extra;
        }
        if at != types.len() {
            return Err(BtfError::Truncated);
        }
        Ok(reader)
    }

    /// The ids of the types named `name`, lowest first.
    fn ids_named(&self, name: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut id = self.last_named.get(name.as_bytes()).copied().unwrap_or(0);
        while id != 0 {
            ids.push(id);
            id = self.earlier_named[id as usize];
        }
        ids.reverse();
        ids
    }

    /// The first type named `name` of kind `kind`.
    pub fn named(&self, name: &str, kind: Kind) -> Option<Type<'_, 'a>> {
        self.ids_named(name)
            .into_iter()
            .filter_map(|id| self.type_by_id(id))
            .find(|ty| ty.kind == kind)
    }

    /// Type `id`; `None` for void (0) and ids past the last.
    pub fn type_by_id(&self, id: u32) -> Option<Type<'_, 'a>> {
        if id == 0 {
            return None;
        }
        let at = *self.starts.get(id as usize)? as usize;
        let info = u32_at(self.types, at + 4)?;
        let vlen = (info & 0xffff) as usize;
        let (kind, extra) = Kind::of((info >> 24) & 0x1f, vlen).ok()?;
        Some(Type {
            reader: self,
            id,
            kind,
            name_offset: u32_at(self.types, at)?,
            kind_flag: info & (1 << 31) != 0,
            size_or_type: u32_at(self.types, at + 8)?,
            data: self
                .types
                .get(at + TYPE_HEADER_BYTES..at + TYPE_HEADER_BYTES + extra)?,
            vlen,
        })
    }

    /// The NUL-terminated string at `offset` of the string section.
    fn string(&self, offset: u32) -> Option<&'a [u8]> {
        let tail = self.strings.get(offset as usize..)?;
        let end = tail.iter().position(|&byte| byte == 0)?;
        Some(&tail[..end])
    }

    /// The string at `offset` as text ("" when absent or not UTF-8).
    fn text(&self, offset: u32) -> &'a str {
        self.string(offset)
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .unwrap_or("")
    }
}

/// One type, read in place.
#[derive(Clone, Copy)]
pub struct Type<'r, 'a> {
    reader: &'r BtfReader<'a>,
    id: u32,
    /// Its kind.
    pub kind: Kind,
    name_offset: u32,
    kind_flag: bool,
    size_or_type: u32,
    /// The kind's trailing records (members, parameters, enumerators, …).
    data: &'a [u8],
    vlen: usize,
}

/// A struct's or union's member.
pub struct Member<'r, 'a> {
    /// Its name ("" for an anonymous struct or union).
    pub name: &'a str,
    /// Its offset in bits from the start of the struct.
    pub bit_offset: u32,
    /// Its type (`None`: void).
    pub ty: Option<Type<'r, 'a>>,
}

impl<'r, 'a> Type<'r, 'a> {
    /// Its id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Its name ("" when anonymous).
    pub fn name(&self) -> &'a str {
        self.reader.text(self.name_offset)
    }

    /// Its size in bytes (structs, unions, enums, ints, floats).
    pub fn size(&self) -> u32 {
        self.size_or_type
    }

    /// The type it refers to: a pointer's target, a typedef's or qualifier's type, a
    /// function's prototype, a variable's type.
    pub fn target(&self) -> Option<Type<'r, 'a>> {
        match self.kind {
            Kind::Ptr
            | Kind::Typedef
            | Kind::Volatile
            | Kind::Const
            | Kind::Restrict
            | Kind::TypeTag
            | Kind::Func
            | Kind::Var
            | Kind::DeclTag => self.reader.type_by_id(self.size_or_type),
            _ => None,
        }
    }

    /// The type under any typedefs and qualifiers.
    pub fn resolved(self) -> Type<'r, 'a> {
        let mut ty = self;
        // Bounded: a malformed loop of typedefs ends here, not in a hang.
        for _ in 0..32 {
            match ty.kind {
                Kind::Typedef | Kind::Volatile | Kind::Const | Kind::Restrict | Kind::TypeTag => {
                    match ty.target() {
                        Some(target) => ty = target,
                        None => return ty,
                    }
                }
                _ => return ty,
            }
        }
        ty
    }

    /// Its members, if it is a struct or union.
    pub fn members(&self) -> impl Iterator<Item = Member<'r, 'a>> + '_ {
        let records = match self.kind {
            Kind::Struct | Kind::Union => self.vlen,
            _ => 0,
        };
        (0..records).filter_map(move |index| {
            let record = self.data.get(12 * index..12 * index + 12)?;
            let offset = u32_at(record, 8)?;
            Some(Member {
                name: self.reader.text(u32_at(record, 0)?),
                // With kind_flag the top byte holds a bit field's width.
                bit_offset: if self.kind_flag {
                    offset & 0x00ff_ffff
                } else {
                    offset
                },
                ty: self.reader.type_by_id(u32_at(record, 4)?),
            })
        })
    }

    /// Its enumerators' names and values, if it is an enum.
    pub fn enumerators(&self) -> impl Iterator<Item = (&'a str, i64)> + '_ {
        let (records, width) = match self.kind {
            Kind::Enum => (self.vlen, 8),
            Kind::Enum64 => (self.vlen, 12),
            _ => (0, 8),
        };
        (0..records).filter_map(move |index| {
            let record = self.data.get(width * index..width * (index + 1))?;
            let low = u32_at(record, 4)?;
            // kind_flag marks a signed enum.
            let value = if width == 12 {
                (i64::from(u32_at(record, 8)?) << 32) | i64::from(low)
            } else if self.kind_flag {
                i64::from(low as i32)
            } else {
                i64::from(low)
            };
            Some((self.reader.text(u32_at(record, 0)?), value))
        })
    }

    /// Its parameters' names, if it is a function prototype (a variadic one's last is "").
    pub fn parameter_names(&self) -> Vec<&'a str> {
        if self.kind != Kind::FuncProto {
            return Vec::new();
        }
        (0..self.vlen)
            .filter_map(|index| u32_at(self.data, 8 * index))
            .map(|name_offset| self.reader.text(name_offset))
            .collect()
    }

    /// An array's element type and length.
    pub fn array(&self) -> Option<(Type<'r, 'a>, u32)> {
        if self.kind != Kind::Array {
            return None;
        }
        Some((
            self.reader.type_by_id(u32_at(self.data, 0)?)?,
            u32_at(self.data, 8)?,
        ))
    }
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small BTF blob: `int`, `struct pair { int a; int b: 3; }`, a typedef of it, and
    /// the signed `enum e { X = -1 }`.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0pair\0a\0b\0pair_t\0e\0X\0";
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for word in words {
                types.extend_from_slice(&word.to_le_bytes());
            }
        };
        // 1: int, 4 bytes.
        push(&[1, 1 << 24, 4, 32]);
        // 2: struct pair, kind_flag, two members.
        push(&[
            5,
            (1 << 31) | (4 << 24) | 2,
            8,
            10,
            1,
            0,
            12,
            1,
            (3 << 24) | 32,
        ]);
        // 3: typedef pair_t → 2.
        push(&[14, 8 << 24, 2]);
        // 4: enum e { X = -1 }, signed (kind_flag).
        push(&[21, (1 << 31) | (6 << 24) | 1, 4, 23, u32::MAX]);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0xeb9f_u16.to_le_bytes());
        bytes.extend_from_slice(&[1, 0]);
        for word in [24, 0, types.len() as u32, types.len() as u32] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&types);
        bytes.extend_from_slice(strings);
        bytes
    }

    #[test]
    fn reads_members_typedefs_and_enumerators_in_place() {
        let bytes = blob();
        let btf = BtfReader::parse(&bytes).unwrap();
        let pair = btf.named("pair", Kind::Struct).unwrap();
        assert_eq!(pair.size(), 8);
        let members: Vec<(&str, u32)> = pair.members().map(|m| (m.name, m.bit_offset)).collect();
        assert_eq!(members, [("a", 0), ("b", 32)]);
        let typedef = btf.named("pair_t", Kind::Typedef).unwrap();
        assert_eq!(typedef.resolved().name(), "pair");
        let e = btf.named("e", Kind::Enum).unwrap();
        assert_eq!(e.enumerators().collect::<Vec<_>>(), [("X", -1)]);
        assert!(btf.named("pair", Kind::Union).is_none());
        assert!(btf.ids_named("missing").is_empty());
    }

    #[test]
    fn refuses_what_is_not_btf_or_is_cut_short() {
        assert!(matches!(BtfReader::parse(b"ELF"), Err(BtfError::NotBtf)));
        let bytes = blob();
        assert!(BtfReader::parse(&bytes[..bytes.len() - 10]).is_err());
    }
}
