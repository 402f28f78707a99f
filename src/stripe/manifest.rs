//! The two small text files that declare a stripe set: the manifest in the
//! striped folder (`.deepnvme-stripe`: the set's id, unit and members) and
//! a marker in each member folder (`.deepnvme-stripe-member`: which set and
//! which place in it the folder is). Both are `key = value` lines, so a
//! person can read them and `deepnvme stripe inspect` can explain them.
//!
//! The manifest is looked up per op (one `stat` when cached) so every
//! process, rank and tool sees the same layout with no setting of its own.
//! Caches here are taken with `try_lock` only: a child of `fork()` that
//! inherits one held simply reads the files again.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::rt::sync::Mutex;

use super::layout::Layout;

/// The manifest's name in the striped folder.
pub const MANIFEST_NAME: &str = ".deepnvme-stripe";
/// The marker's name in each member folder.
pub const MARKER_NAME: &str = ".deepnvme-stripe-member";
/// The format both files are written in.
const FORMAT: u32 = 1;

/// A stripe set, as its manifest declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The striped folder (where the manifest is), as found.
    pub root: PathBuf,
    /// Random, made at `create`: files and members name the set by it.
    pub id: String,
    /// The stripe unit in bytes.
    pub unit: u64,
    /// Absolute member folders, in stripe order.
    pub members: Vec<PathBuf>,
}

impl Manifest {
    /// How the set lays a file's bytes over its members.
    pub fn layout(&self) -> Layout {
        Layout { unit: self.unit, members: self.members.len() }
    }

    /// The manifest's text.
    pub fn format(&self) -> String {
        let mut s = String::new();
        s.push_str("# deepnvme stripe set, made by `deepnvme stripe create` (see `deepnvme stripe inspect`).\n");
        s.push_str("# Files deepnvme writes under this folder keep their bytes in the member folders below,\n");
        s.push_str("# unit by unit in turn; the files here are placeholders of the right size. Do not edit:\n");
        s.push_str("# `deepnvme stripe remove` and `create` change a set.\n");
        s.push_str(&format!("format = {FORMAT}\nid = {}\nunit = {}\n", self.id, self.unit));
        for m in &self.members {
            s.push_str(&format!("member = {}\n", m.display()));
        }
        s
    }

    /// Parses a manifest's text; `root` is the folder it was found in.
    pub fn parse(text: &str, root: &Path) -> Result<Manifest, String> {
        let (mut id, mut unit, mut members, mut format) = (None, None, Vec::new(), None);
        for (key, value) in lines(text)? {
            match key {
                "format" => format = Some(value.parse::<u32>().map_err(|_| format!("format {value:?} is not a number"))?),
                "id" => id = Some(value.to_string()),
                "unit" => unit = Some(value.parse::<u64>().map_err(|_| format!("unit {value:?} is not a number"))?),
                "member" => members.push(PathBuf::from(value)),
                other => return Err(format!("unknown key {other:?}")),
            }
        }
        match format {
            Some(FORMAT) => {}
            Some(f) => return Err(format!("format {f} is newer than this deepnvme reads ({FORMAT})")),
            None => return Err("no format line".into()),
        }
        let id = id.filter(|i| valid_id(i)).ok_or("no valid id line")?;
        let unit = unit.ok_or("no unit line")?;
        check_unit(unit)?;
        if members.is_empty() {
            return Err("no member lines".into());
        }
        if let Some(m) = members.iter().find(|m| !m.is_absolute()) {
            return Err(format!("member {} is not an absolute path", m.display()));
        }
        Ok(Manifest { root: root.to_path_buf(), id, unit, members })
    }

    /// The marker member `index` must hold.
    pub(crate) fn marker(&self, index: usize) -> Marker {
        Marker { id: self.id.clone(), index, count: self.members.len(), unit: Some(self.unit), set: self.root.clone() }
    }
}

/// What a member folder's marker says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Marker {
    pub id: String,
    pub index: usize,
    pub count: usize,
    /// The stripe unit the set was made with, so that an edited manifest
    /// cannot scramble reads (`None`: a marker from before it was kept).
    pub unit: Option<u64>,
    /// The striped folder the member belongs to (for people; not trusted).
    pub set: PathBuf,
}

impl Marker {
    pub fn format(&self) -> String {
        format!(
            "# deepnvme stripe member: this folder holds member {} of {} of the stripe set at {}.\n\
             # Its files are parts of striped files; read them with `deepnvme stripe cat`.\n\
             format = {FORMAT}\nid = {}\nindex = {}\ncount = {}\n{}set = {}\n",
            self.index,
            self.count,
            self.set.display(),
            self.id,
            self.index,
            self.count,
            self.unit.map(|u| format!("unit = {u}\n")).unwrap_or_default(),
            self.set.display()
        )
    }

    pub fn parse(text: &str) -> Result<Marker, String> {
        let (mut id, mut index, mut count, mut set, mut format, mut unit) = (None, None, None, None, None, None);
        for (key, value) in lines(text)? {
            let number = |v: &str| v.parse::<usize>().map_err(|_| format!("{key} {v:?} is not a number"));
            match key {
                "format" => format = Some(number(value)?),
                "id" => id = Some(value.to_string()),
                "index" => index = Some(number(value)?),
                "count" => count = Some(number(value)?),
                "unit" => unit = Some(number(value)? as u64),
                "set" => set = Some(PathBuf::from(value)),
                other => return Err(format!("unknown key {other:?}")),
            }
        }
        if format != Some(FORMAT as usize) {
            return Err(format!("format {format:?} is not {FORMAT}"));
        }
        Ok(Marker {
            id: id.ok_or("no id line")?,
            index: index.ok_or("no index line")?,
            count: count.ok_or("no count line")?,
            unit,
            set: set.unwrap_or_default(),
        })
    }
}

fn lines(text: &str) -> Result<Vec<(&str, &str)>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| format!("line {line:?} has no '='"))?;
        out.push((k.trim(), v.trim()));
    }
    Ok(out)
}

fn valid_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A unit must be a whole number of 4 KiB (every member's O_DIRECT
/// alignment and page divide it) and at most 1 GiB.
pub fn check_unit(unit: u64) -> Result<(), String> {
    if unit == 0 || unit % 4096 != 0 || unit > 1 << 30 {
        return Err(format!("stripe unit {unit} must be a multiple of 4096 bytes, at most 1 GiB"));
    }
    Ok(())
}

/// A fresh random set id (16 hex digits).
pub fn new_id() -> io::Result<String> {
    let mut bytes = [0u8; 8];
    // The raw system call: glibc's getrandom() wrapper is 2.25+, and the
    // wheel's floor is glibc 2.17 (as for statx, file/stat.rs).
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the array.
    let n = unsafe { libc::syscall(libc::SYS_getrandom, bytes.as_mut_ptr() as *mut libc::c_void, bytes.len(), 0) };
    if n != bytes.len() as libc::c_long {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// What identifies one version of a manifest file, to reuse its parse.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

fn key_of(meta: &std::fs::Metadata) -> FileKey {
    FileKey { dev: meta.dev(), ino: meta.ino(), size: meta.size(), mtime: meta.mtime(), mtime_nsec: meta.mtime_nsec() }
}

/// Parsed manifests by folder, with the version of the file each came from.
type ManifestCache = HashMap<PathBuf, (FileKey, Arc<Manifest>)>;

static MANIFESTS: Mutex<Option<ManifestCache>> = Mutex::new(None);

/// Why a manifest could not be had.
#[derive(Debug)]
pub enum LoadError {
    Missing,
    Io(io::Error),
    Invalid(String),
}

/// The manifest in `root` (one `stat` when this process read it before).
pub fn load(root: &Path) -> Result<Arc<Manifest>, LoadError> {
    let path = root.join(MANIFEST_NAME);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(LoadError::Missing),
        Err(e) => return Err(LoadError::Io(e)),
    };
    let key = key_of(&meta);
    if let Some(cache) = MANIFESTS.try_lock() {
        if let Some((k, m)) = cache.as_ref().and_then(|c| c.get(root)) {
            if *k == key {
                return Ok(m.clone());
            }
        }
    }
    let text = std::fs::read_to_string(&path).map_err(LoadError::Io)?;
    let manifest = Arc::new(Manifest::parse(&text, root).map_err(LoadError::Invalid)?);
    if let Some(mut cache) = MANIFESTS.try_lock() {
        cache.get_or_insert_with(HashMap::new).insert(root.to_path_buf(), (key, manifest.clone()));
    }
    Ok(manifest)
}

/// The nearest folder at or above `dir` that holds a manifest.
pub fn find_root(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find(|d| d.join(MANIFEST_NAME).exists()).map(Path::to_path_buf)
}

/// The marker of member folder `dir`, and the device it is on.
pub fn read_marker(dir: &Path) -> io::Result<(Marker, u64)> {
    let path = dir.join(MARKER_NAME);
    let text = std::fs::read_to_string(&path)?;
    let dev = std::fs::metadata(&path)?.dev();
    let marker = Marker::parse(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
    Ok((marker, dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_and_marker_round_trip() {
        let m = Manifest {
            root: PathBuf::from("/nvme"),
            id: "0123456789abcdef".into(),
            unit: 1 << 20,
            members: vec![PathBuf::from("/a/s"), PathBuf::from("/b/with space")],
        };
        assert_eq!(Manifest::parse(&m.format(), Path::new("/nvme")).unwrap(), m);
        let k = m.marker(1);
        assert_eq!(Marker::parse(&k.format()).unwrap(), k);
    }

    #[test]
    fn bad_manifests_say_why() {
        let root = Path::new("/r");
        let ok = "format = 1\nid = 0123456789abcdef\nunit = 4096\nmember = /a\n";
        assert!(Manifest::parse(ok, root).is_ok());
        for (text, why) in [
            ("id = 0123456789abcdef\nunit = 4096\nmember = /a\n", "no format"),
            ("format = 2\nid = 0123456789abcdef\nunit = 4096\nmember = /a\n", "newer"),
            ("format = 1\nid = xyz\nunit = 4096\nmember = /a\n", "id"),
            ("format = 1\nid = 0123456789abcdef\nunit = 1000\nmember = /a\n", "multiple of 4096"),
            ("format = 1\nid = 0123456789abcdef\nunit = 4096\n", "no member"),
            ("format = 1\nid = 0123456789abcdef\nunit = 4096\nmember = rel\n", "absolute"),
            ("format = 1\nid = 0123456789abcdef\nunit = 4096\nmember = /a\ncolour = red\n", "unknown key"),
        ] {
            let e = Manifest::parse(text, root).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
