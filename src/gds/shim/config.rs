//! The cuFile JSON config the driver is opened with, in a private directory.
//!
//! DeepSpeed wrote `./local_cufile.json` into the current directory (and
//! pointed `CUFILE_ENV_PATH_JSON` at the literal, unexpanded
//! `$PWD/local_cufile.json`, so cuFile never read it). Here the file goes
//! into a fresh `mkdtemp` directory (mode 0700) under `$TMPDIR` or `/tmp`,
//! which is removed when the driver closes. cuFile's own log goes there too
//! (`logging.dir`), instead of a `cufile.log` in the current directory; its
//! lines are relayed to stderr when the driver closes, and quoted in the
//! error when opening the driver fails. `CUFILE_LOGFILE_PATH` (cuFile's own
//! variable) still sends the log elsewhere.
//!
//! The keys are DeepSpeed's; cuFile reads them from the `execution` section
//! (`CUFileSizeTConfigParameter_t`: `EXECUTION_MAX_IO_QUEUE_DEPTH`,
//! `EXECUTION_MAX_IO_THREADS`, `EXECUTION_MIN_IO_THRESHOLD_SIZE_KB`,
//! `EXECUTION_MAX_REQUEST_PARALLELISM`; `parallel_io` is a bool there too).
//! A config file replaces `/etc/cufile.json` wholesale (unset keys take
//! cuFile's defaults), so none is written on a machine that has its own
//! `/etc/cufile.json`: its tuning wins.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use crate::knobs::CUFILE_ENV_PATH_JSON;
pub(crate) use crate::knobs::GDS_MIN_IO_THRESHOLD_SIZE_KB as MIN_IO_THRESHOLD_SIZE_KB;
use crate::gds::error::GdsError;
use crate::error::Error;
use crate::knobs;

/// The settings the driver is opened with (those of the first handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverSettings {
    /// The first handle's queue depth (cuFile's `max_io_queue_depth`).
    pub queue_depth: usize,
    /// The first handle's worker count (cuFile's `max_io_threads`).
    pub intra_op_parallelism: usize,
    /// The first handle's block size (cuFile's max direct-I/O size).
    pub block_size: usize,
}

impl DriverSettings {
    /// DeepSpeed's handle defaults: queue depth 128, parallelism 1, 1 MiB blocks.
    pub const DEFAULT: DriverSettings = DriverSettings {
        queue_depth: knobs::DEFAULT_QUEUE_DEPTH,
        intra_op_parallelism: knobs::DEFAULT_INTRA_OP_PARALLELISM,
        block_size: knobs::DEFAULT_BLOCK_SIZE,
    };

    /// The max direct-I/O size given to cuFile, in KiB (block_size / 1024).
    pub(crate) fn max_direct_io_kb(&self) -> usize {
        self.block_size / 1024
    }

    /// [`Error::InvalidArgument`] ("GDS handle: ...") for a zero setting or a
    /// block size under 1 KiB.
    pub(crate) fn validate(&self) -> crate::Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("GDS handle: {m}")));
        if self.queue_depth == 0 {
            return bad("queue_depth must be at least 1".into());
        }
        if self.intra_op_parallelism == 0 {
            return bad("intra_op_parallelism must be at least 1".into());
        }
        if self.block_size < knobs::GDS_MIN_BLOCK_SIZE {
            return bad(format!(
                "block_size = {} is below 1 KiB; cuFile's max direct-I/O size is block_size / 1024 KiB",
                self.block_size
            ));
        }
        Ok(())
    }
}

use crate::rt::json::string as json_string;

/// The config text: DeepSpeed's `execution` keys, plus the log directory.
pub(crate) fn config_json(settings: &DriverSettings, log_dir: &str) -> String {
    format!(
        "{{\n  \"logging\": {{\n    \"dir\": {}\n  }},\n  \"execution\": {{\n    \"max_io_queue_depth\": {},\n    \
         \"max_request_parallelism\": {},\n    \"max_io_threads\": {},\n    \"parallel_io\": true,\n    \
         \"min_io_threshold_size_kb\": {}\n  }}\n}}\n",
        json_string(log_dir),
        settings.queue_depth,
        settings.intra_op_parallelism,
        settings.intra_op_parallelism,
        MIN_IO_THRESHOLD_SIZE_KB
    )
}

/// cuFile's default config path, when the machine has one.
pub(crate) fn site_config() -> Option<PathBuf> {
    let p = PathBuf::from("/etc/cufile.json");
    p.is_file().then_some(p)
}

/// The base directory for the private config directory: `$TMPDIR` when it
/// is an absolute UTF-8 path to a directory, else `/tmp`.
pub(crate) fn temp_base() -> PathBuf {
    let t = std::env::temp_dir();
    if t.is_absolute() && t.to_str().is_some() && t.is_dir() {
        t
    } else {
        PathBuf::from("/tmp")
    }
}

/// A private directory holding `cufile.json` (and cuFile's log). Removed,
/// with everything in it, on drop.
#[derive(Debug)]
pub(crate) struct ConfigDir {
    dir: PathBuf,
    file: PathBuf,
}

impl ConfigDir {
    /// Creates `<base>/deepnvme-cufile-XXXXXX` (mode 0700) and writes
    /// `cufile.json` (mode 0600) into it.
    pub fn create(base: &Path, settings: &DriverSettings) -> Result<ConfigDir, GdsError> {
        let fail = |action: &'static str, path: &Path, e: std::io::Error| GdsError::Config {
            action,
            path: path.to_path_buf(),
            source: Arc::new(e),
        };
        const MKDIR: &str = "creating a private directory for the cuFile config under";
        let mut bytes = CString::new(base.join("deepnvme-cufile-XXXXXX").into_os_string().into_vec())
            .map_err(|_| {
                fail(MKDIR, base, std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path contains a NUL byte"))
            })?
            .into_bytes_with_nul();
        // SAFETY: a writable NUL-terminated template ending in XXXXXX.
        let p = unsafe { libc::mkdtemp(bytes.as_mut_ptr() as *mut libc::c_char) };
        if p.is_null() {
            return Err(fail(MKDIR, base, std::io::Error::last_os_error()));
        }
        bytes.pop(); // the NUL
        let dir = PathBuf::from(std::ffi::OsString::from_vec(bytes));
        // From here on, drop removes the directory.
        let me = ConfigDir { file: dir.join("cufile.json"), dir };
        // mkdtemp uses 0700 already; say so explicitly whatever the umask did.
        std::fs::set_permissions(&me.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail("chmod 0700", &me.dir, e))?;
        let log_dir = me.dir.to_str().ok_or_else(|| {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidData, "the path is not UTF-8");
            fail("using as cuFile's log directory", &me.dir, e)
        })?;
        let text = config_json(settings, log_dir);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&me.file)
            .map_err(|e| fail("creating", &me.file, e))?;
        f.write_all(text.as_bytes()).map_err(|e| fail("writing", &me.file, e))?;
        Ok(me)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The config file, for `CUFILE_ENV_PATH_JSON`.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The lines cuFile logged into this directory (its `cufile_*.log`
    /// files), the last `max` of them.
    pub fn log_lines(&self, max: usize) -> Vec<String> {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect(),
            Err(_) => return Vec::new(),
        };
        files.sort();
        let mut lines: Vec<String> = files
            .iter()
            .filter_map(|p| std::fs::read(p).ok())
            .flat_map(|b| {
                String::from_utf8_lossy(&b)
                    .lines()
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
            })
            .collect();
        if lines.len() > max {
            lines.drain(..lines.len() - max);
        }
        lines
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                crate::rt::log::error(&format!("removing the cuFile config directory {} failed: {e}", self.dir.display()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("deepnvme-gds-config-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn config_is_private_holds_the_settings_and_is_removed_on_drop() {
        let base = scratch("private");
        let settings = DriverSettings { queue_depth: 32, intra_op_parallelism: 4, block_size: 8 << 20 };
        let cfg = ConfigDir::create(&base, &settings).expect("create");
        let dir = cfg.dir().to_path_buf();
        assert!(dir.starts_with(&base), "{} under {}", dir.display(), base.display());
        assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("deepnvme-cufile-"));
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700, "directory is private");
        // SAFETY: geteuid takes nothing and cannot fail.
        assert_eq!(meta.uid(), unsafe { libc::geteuid() });
        let fmeta = std::fs::metadata(cfg.file()).unwrap();
        assert_eq!(fmeta.mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(cfg.file()).unwrap();
        assert!(text.contains("\"execution\""), "{text}");
        assert!(text.contains("\"max_io_queue_depth\": 32"), "{text}");
        assert!(text.contains("\"max_request_parallelism\": 4"), "{text}");
        assert!(text.contains("\"max_io_threads\": 4"), "{text}");
        assert!(text.contains("\"parallel_io\": true"), "{text}");
        assert!(text.contains("\"min_io_threshold_size_kb\": 8192"), "{text}");
        assert!(text.contains(&format!("\"dir\": {}", json_string(dir.to_str().unwrap()))), "{text}");
        // Nothing was written into the current directory.
        let cwd_after: Vec<_> = std::fs::read_dir(".").unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert!(!cwd_after.iter().any(|n| n == "local_cufile.json" || n == "cufile.json"));
        let cwd = std::env::current_dir().unwrap();
        assert!(!cfg.file().starts_with(&cwd) || base.starts_with(&cwd), "config is not in the cwd");
        std::fs::write(dir.join("cufile_1_x.log"), "line one\n\nNOTICE compat mode\n").unwrap();
        assert_eq!(cfg.log_lines(10), vec!["line one".to_string(), "NOTICE compat mode".to_string()]);
        assert_eq!(cfg.log_lines(1), vec!["NOTICE compat mode".to_string()]);
        drop(cfg);
        assert!(!dir.exists(), "removed with its contents on drop");
        std::fs::remove_dir_all(&base).ok();
    }

    #[test]
    fn two_configs_get_distinct_directories() {
        let base = scratch("distinct");
        let a = ConfigDir::create(&base, &DriverSettings::DEFAULT).unwrap();
        let b = ConfigDir::create(&base, &DriverSettings::DEFAULT).unwrap();
        assert_ne!(a.dir(), b.dir());
        drop((a, b));
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0);
        std::fs::remove_dir_all(&base).ok();
    }

    #[test]
    fn an_unusable_base_is_an_error_not_a_panic() {
        let err = ConfigDir::create(Path::new("/nonexistent/deepnvme/base"), &DriverSettings::DEFAULT).unwrap_err();
        match &err {
            GdsError::Config { path, source, .. } => {
                assert_eq!(path, Path::new("/nonexistent/deepnvme/base"));
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("{other:?}"),
        }
        assert!(std::error::Error::source(&err).is_some());
        let err = err.to_string();
        assert!(err.contains("/nonexistent/deepnvme/base") && err.contains("private directory"), "{err}");
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
        assert_eq!(json_string("\u{1}"), "\"\\u0001\"");
    }

    #[test]
    fn settings_are_checked() {
        assert!(DriverSettings::DEFAULT.validate().is_ok());
        assert_eq!(DriverSettings::DEFAULT.max_direct_io_kb(), 1024);
        assert!(DriverSettings { queue_depth: 0, ..DriverSettings::DEFAULT }.validate().is_err());
        assert!(DriverSettings { intra_op_parallelism: 0, ..DriverSettings::DEFAULT }.validate().is_err());
        let e = DriverSettings { block_size: 512, ..DriverSettings::DEFAULT }.validate().unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("1 KiB") && m.starts_with("GDS handle: ")), "{e}");
    }
}
