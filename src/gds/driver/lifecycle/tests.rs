//! The driver's open/close rules ([`DriverCore`]) with fake cuFile calls
//! and a fake environment: reference counting, the private config, the
//! user's and the machine's own configs, failed opens, leftovers.

use super::*;
use crate::gds::driver::registry::tests::FakeRegistrar;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;

#[derive(Default)]
struct FakeOps {
    reg: FakeRegistrar,
    log: Mutex<Vec<String>>,
    not_ready: Mutex<Option<GdsError>>,
    fail_open: Mutex<Option<GdsError>>,
    fail_size: Mutex<Option<GdsError>>,
    /// Someone else has the driver open (cuFileDriverOpen says ALREADY_OPEN).
    already_open: Mutex<bool>,
    /// What CUFILE_ENV_PATH_JSON held when open() ran.
    env_at_open: Mutex<Option<Option<OsString>>>,
    /// The library has cuFile's parameter API (1.14+).
    parameter_api: bool,
    /// ... and it refuses (say, the driver is already open).
    fail_parameters: Mutex<Option<GdsError>>,
    env: Mutex<Option<std::sync::Arc<FakeEnv>>>,
}

impl Registrar for FakeOps {
    fn device_of(&self, ptr: u64) -> Result<i32, GdsError> {
        self.reg.device_of(ptr)
    }
    fn register(&self, ptr: u64, len: usize, device: i32) -> Result<(), GdsError> {
        self.reg.register(ptr, len, device)
    }
    fn deregister(&self, ptr: u64, device: i32) -> Result<(), GdsError> {
        self.reg.deregister(ptr, device)
    }
}

impl DriverOps for FakeOps {
    fn ready(&self) -> Result<(), GdsError> {
        match self.not_ready.lock().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    fn open(&self) -> Result<bool, GdsError> {
        self.log.lock().push("open".into());
        if let Some(env) = self.env.lock().as_ref() {
            let v = env.get(CUFILE_ENV_PATH_JSON);
            // cuFile writes its log into logging.dir while opening.
            if let Some(file) = &v {
                let dir = PathBuf::from(file).parent().unwrap().to_path_buf();
                if dir.join("cufile.json").exists() {
                    std::fs::write(dir.join("cufile_1_fake.log"), "NOTICE cuFile running in compatible mode\n")
                        .ok();
                }
            }
            *self.env_at_open.lock() = Some(v);
        }
        match self.fail_open.lock().clone() {
            Some(e) => Err(e),
            None => Ok(!*self.already_open.lock()),
        }
    }
    fn set_parameters(&self, settings: &DriverSettings, log_dir: &std::path::Path) -> Result<bool, GdsError> {
        if let Some(e) = self.fail_parameters.lock().clone() {
            return Err(e);
        }
        if self.parameter_api {
            self.log.lock().push(format!(
                "parameters qd={} threads={} log_dir={}",
                settings.queue_depth,
                settings.intra_op_parallelism,
                log_dir.display()
            ));
        }
        Ok(self.parameter_api)
    }
    fn set_max_direct_io_kb(&self, kb: usize) -> Result<(), GdsError> {
        self.log.lock().push(format!("max_direct_io {kb}"));
        match self.fail_size.lock().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    fn close(&self, close_driver: bool) -> Result<(), GdsError> {
        self.log.lock().push(if close_driver { "close" } else { "release-only" }.into());
        Ok(())
    }
}

#[derive(Default)]
struct FakeEnv(Mutex<HashMap<String, OsString>>);

impl EnvAccess for std::sync::Arc<FakeEnv> {
    fn get(&self, key: &str) -> Option<OsString> {
        self.0.lock().get(key).cloned()
    }
    fn set(&self, key: &str, value: &std::path::Path) {
        self.0.lock().insert(key.into(), value.as_os_str().to_owned());
    }
    fn remove(&self, key: &str) {
        self.0.lock().remove(key);
    }
}

fn setup(tag: &str) -> (DriverCore<FakeOps, std::sync::Arc<FakeEnv>>, std::sync::Arc<FakeEnv>, PathBuf) {
    let base = std::env::temp_dir().join(format!("deepnvme-gds-driver-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let env = std::sync::Arc::new(FakeEnv::default());
    let ops = FakeOps::default();
    *ops.env.lock() = Some(env.clone());
    let b = base.clone();
    let core = DriverCore::new(ops, env.clone(), Box::new(move || b.clone()));
    (core, env, base)
}

/// With cuFile's parameter API (1.14+) the settings and the log directory
/// are set in-process before open, and the environment is never written
/// (setenv races a concurrent getenv in other threads: CUDA, NCCL, torch).
#[test]
fn the_parameter_api_configures_cufile_without_touching_the_environment() {
    let base = std::env::temp_dir().join(format!("deepnvme-gds-driver-params-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let env = std::sync::Arc::new(FakeEnv::default());
    let ops = FakeOps { parameter_api: true, ..FakeOps::default() };
    *ops.env.lock() = Some(env.clone());
    let b = base.clone();
    let core = DriverCore::new(ops, env.clone(), Box::new(move || b.clone()));
    let settings = DriverSettings { queue_depth: 64, intra_op_parallelism: 2, block_size: 4 << 20 };
    let g = core.acquire(settings).unwrap();
    assert_eq!(*core.ops.env_at_open.lock(), Some(None), "CUFILE_ENV_PATH_JSON was set");
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None);
    let log = core.ops.log.lock().clone();
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(log[0].starts_with("parameters qd=64 threads=2 log_dir="), "parameters before open: {log:?}");
    let log_dir = PathBuf::from(log[0].split("log_dir=").nth(1).unwrap());
    assert!(log_dir.starts_with(&base) && log_dir.is_dir(), "cuFile logs into our private directory");
    assert_eq!(&log[1..], ["open".to_string(), "max_direct_io 4096".to_string()]);
    drop(g);
    assert!(!log_dir.exists(), "the private directory goes at close");
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None);
    assert_eq!(entries(&base), 0);
}

/// A parameter API that refuses is not a failed handle: the config goes
/// through the file, as without the API.
#[test]
fn a_refused_parameter_api_falls_back_to_the_config_file() {
    let (core, env, _base) = setup("params-refused");
    *core.ops.fail_parameters.lock() = Some(GdsError::Unavailable("driver already open".into()));
    let g = core.acquire(DriverSettings::DEFAULT).unwrap();
    let file = core.config_file().expect("a config file was written");
    assert_eq!(*core.ops.env_at_open.lock(), Some(Some(file.into_os_string())), "the env file was used");
    drop(g);
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None);
}

fn entries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map(|r| r.count()).unwrap_or(0)
}

#[test]
fn first_guard_opens_last_guard_closes_and_config_lives_in_between() {
    let (core, env, base) = setup("refcount");
    let settings = DriverSettings { queue_depth: 64, intra_op_parallelism: 2, block_size: 4 << 20 };
    let g1 = core.acquire(settings).unwrap();
    let file = core.config_file().expect("a config was written");
    let dir = file.parent().unwrap().to_path_buf();
    assert!(dir.starts_with(&base) && dir != base, "private dir under the temp base");
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"max_io_queue_depth\": 64") && text.contains("\"max_io_threads\": 2"), "{text}");
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), Some(file.clone().into_os_string()), "env points at our file");
    assert_eq!(*core.ops.env_at_open.lock(), Some(Some(file.clone().into_os_string())), "set BEFORE open");
    assert_eq!(*core.ops.log.lock(), vec!["open".to_string(), "max_direct_io 4096".to_string()]);

    let g2 = core.acquire(DriverSettings::DEFAULT).unwrap();
    assert_eq!(core.refs(), 2);
    assert_eq!(core.settings(), Some(settings), "the first handle's settings stay");
    assert_eq!(core.ops.log.lock().len(), 2, "no second open");
    drop(g1);
    assert!(file.exists(), "still open: config stays");
    assert_eq!(core.ops.log.lock().len(), 2);
    drop(g2);
    assert_eq!(core.refs(), 0);
    assert_eq!(core.ops.log.lock().last().map(String::as_str), Some("close"));
    assert!(!dir.exists(), "config directory removed at close");
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None, "our variable is taken back");
    assert_eq!(entries(&base), 0);

    // Reopening writes a fresh directory.
    let g = core.acquire(settings).unwrap();
    let file2 = core.config_file().unwrap();
    assert_ne!(file2, file);
    drop(g);
    assert!(!file2.exists());
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn a_users_cufile_env_path_json_is_kept() {
    let (core, env, base) = setup("userenv");
    env.set(CUFILE_ENV_PATH_JSON, std::path::Path::new("/etc/my-cufile.json"));
    let g = core.acquire(DriverSettings::DEFAULT).unwrap();
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), Some(OsString::from("/etc/my-cufile.json")));
    assert_eq!(*core.ops.env_at_open.lock(), Some(Some(OsString::from("/etc/my-cufile.json"))));
    assert_eq!(core.config_file(), None, "nothing written");
    assert_eq!(entries(&base), 0);
    drop(g);
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), Some(OsString::from("/etc/my-cufile.json")), "left alone at close");
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn a_site_cufile_json_is_used_instead_of_a_private_one() {
    let (core, env, base) = setup("siteconf");
    let core = core.with_site_config(Box::new(|| Some(PathBuf::from("/etc/cufile.json"))));
    let g = core.acquire(DriverSettings::DEFAULT).unwrap();
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None, "cuFile reads its default, the site's file");
    assert_eq!(*core.ops.env_at_open.lock(), Some(None));
    assert_eq!(core.config_file(), None, "nothing written");
    assert_eq!(entries(&base), 0);
    drop(g);
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn a_failed_open_undoes_everything_and_quotes_the_cufile_log() {
    let (core, env, base) = setup("failopen");
    *core.ops.fail_open.lock() = Some(GdsError::cufile("cuFileDriverOpen", 5033, None, 0));
    let err = core.acquire(DriverSettings::DEFAULT).err().expect("open fails");
    match &err {
        crate::Error::Gds(GdsError::DriverOpen { source, log }) => {
            assert!(matches!(**source, GdsError::CuFile { code: 5033, .. }), "{source:?}");
            assert_eq!(log.len(), 1, "{log:?}");
        }
        other => panic!("{other:?}"),
    }
    let err = err.to_string();
    assert!(err.contains("CU_FILE_NVFS_SETUP_ERROR"), "{err}");
    assert!(err.contains("cuFile log: NOTICE cuFile running in compatible mode"), "{err}");
    assert_eq!(core.refs(), 0);
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None);
    assert_eq!(entries(&base), 0, "config directory removed");
    // A later acquire tries again.
    *core.ops.fail_open.lock() = None;
    let g = core.acquire(DriverSettings::DEFAULT).unwrap();
    assert_eq!(core.refs(), 1);
    drop(g);
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn a_refused_direct_io_size_closes_again() {
    let (core, env, base) = setup("failsize");
    *core.ops.fail_size.lock() = Some(GdsError::cufile("cuFileDriverSetMaxDirectIOSize(1 KiB)", 5022, None, 0));
    let err = core.acquire(DriverSettings { block_size: 1024, ..DriverSettings::DEFAULT }).err().unwrap();
    assert!(matches!(err, crate::Error::Gds(GdsError::DirectIoSize { block_size: 1024, .. })), "{err:?}");
    let err = err.to_string();
    assert!(err.contains("block_size = 1024"), "{err}");
    assert_eq!(*core.ops.log.lock(), vec!["open", "max_direct_io 1", "close"]);
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None);
    assert_eq!(entries(&base), 0);
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn not_ready_means_nothing_is_written_or_opened() {
    let (core, env, base) = setup("notready");
    *core.ops.not_ready.lock() = Some(GdsError::LibraryNotFound {
        library: crate::gds::GdsLibrary::Cuda,
        attempts: Vec::new(),
        override_var: None,
        other: None,
    });
    let err = core.acquire(DriverSettings::DEFAULT).err().unwrap();
    assert!(matches!(err, crate::Error::Gds(GdsError::LibraryNotFound { .. })), "{err:?}");
    let err = err.to_string();
    assert!(err.contains("libcuda"), "{err}");
    assert!(core.ops.log.lock().is_empty(), "cuFileDriverOpen never called");
    assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None);
    assert_eq!(entries(&base), 0);
    let err = core.acquire(DriverSettings { queue_depth: 0, ..DriverSettings::DEFAULT }).err().unwrap();
    assert!(matches!(&err, crate::Error::InvalidArgument(m) if m.contains("queue_depth")), "{err:?}");
    assert!(core.check_open().is_err(), "the probe's check says the same as acquire");
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn a_driver_opened_by_someone_else_is_shared_not_closed() {
    let (core, _env, base) = setup("shared");
    *core.ops.already_open.lock() = true;
    let g = core.acquire(DriverSettings::DEFAULT).unwrap();
    drop(g);
    assert_eq!(*core.ops.log.lock(), vec!["open", "max_direct_io 1024", "release-only"]);
    assert_eq!(entries(&base), 0);
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn closing_deregisters_leftover_buffers() {
    let (core, _env, base) = setup("leftovers");
    let g = core.acquire(DriverSettings::DEFAULT).unwrap();
    core.register(0x7000_0000_0000, 4096).unwrap();
    core.register(0x7000_0010_0000, 4096).unwrap();
    assert!(core.deregister(0x7000_0000_0000).unwrap());
    drop(g);
    assert!(core.regions().is_empty());
    let calls = core.ops.reg.calls.lock().clone();
    assert_eq!(calls.iter().filter(|c| c.starts_with("dereg")).count(), 2, "{calls:?}");
    let log = core.ops.log.lock().clone();
    assert_eq!(log.last().map(String::as_str), Some("close"));
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn guards_from_many_threads_open_once() {
    let (core, _env, base) = setup("threads");
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..50 {
                    let g = core.acquire(DriverSettings::DEFAULT).unwrap();
                    assert!(core.refs() >= 1);
                    drop(g);
                }
            });
        }
    });
    assert_eq!(core.refs(), 0);
    let log = core.ops.log.lock().clone();
    let opens = log.iter().filter(|l| *l == "open").count();
    let closes = log.iter().filter(|l| *l == "close").count();
    assert_eq!(opens, closes, "every open was closed");
    assert!(opens >= 1);
    assert_eq!(entries(&base), 0);
    std::fs::remove_dir_all(&base).ok();
}
