//! The process-wide cuFile driver: opened by the first guard, closed with the
//! last, whatever extension or thread holds them.
//!
//! [`DriverCore`] is the bookkeeping (reference count, config directory,
//! `CUFILE_ENV_PATH_JSON`, registered buffers); the calls into cuFile and
//! the environment go through [`DriverOps`] and [`EnvAccess`], so that the
//! open/close rules are tested without a GPU. The one real instance uses
//! [`CuFileOps`] and the process environment.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use crate::sync::{Mutex, RwLock, RwLockReadGuard};

use super::cuda_api::CuContext;
use super::config::{ConfigDir, DriverKnobs, CUFILE_ENV_PATH_JSON};
use super::error::GdsError;
use super::probe::{environment, Gpu};
use super::registry::{RegionMap, RegisterOutcome, Registrar};

/// The cuFile driver calls (real: [`CuFileOps`]).
pub(crate) trait DriverOps: Registrar + Send + Sync {
    /// Everything that must hold before `cuFileDriverOpen` may be called.
    fn ready(&self) -> Result<(), GdsError>;
    /// `Ok(true)`: opened; `Ok(false)`: it was open already (another user
    /// in the process), so it must not be closed by us.
    fn open(&self) -> Result<bool, GdsError>;
    fn set_max_direct_io_kb(&self, kb: usize) -> Result<(), GdsError>;
    /// Sets the config through cuFile's parameter API (before `open`), with
    /// cuFile's log in `log_dir`. `Ok(false)`: the library has none (cuFile
    /// before 1.14); the config then goes through `CUFILE_ENV_PATH_JSON`.
    fn set_parameters(&self, knobs: &DriverKnobs, log_dir: &std::path::Path) -> Result<bool, GdsError>;
    /// Releases per-device state, and closes the driver when `close_driver`.
    fn close(&self, close_driver: bool) -> Result<(), GdsError>;
}

/// The environment variables the driver reads and sets.
pub(crate) trait EnvAccess: Send + Sync {
    fn get(&self, key: &str) -> Option<OsString>;
    fn set(&self, key: &str, value: &std::path::Path);
    fn remove(&self, key: &str);
}

/// The process environment. Setting a variable while other threads call
/// `getenv` is racy in C (glibc may crash a concurrent getenv); it is only
/// done where cuFile has no parameter API (before 1.14), and then just
/// before `cuFileDriverOpen`, which reads `CUFILE_ENV_PATH_JSON`, as
/// DeepSpeed did. With the parameter API the environment is never touched.
pub(crate) struct ProcessEnv;

impl EnvAccess for ProcessEnv {
    fn get(&self, key: &str) -> Option<OsString> {
        std::env::var_os(key)
    }
    fn set(&self, key: &str, value: &std::path::Path) {
        std::env::set_var(key, value);
    }
    fn remove(&self, key: &str) {
        std::env::remove_var(key);
    }
}

/// What the driver was opened with.
#[derive(Debug)]
struct Session {
    knobs: DriverKnobs,
    /// Our config directory; `None` when the user's CUFILE_ENV_PATH_JSON was kept.
    config: Option<ConfigDir>,
    /// The value we put into CUFILE_ENV_PATH_JSON (removed at close if still ours).
    env_value: Option<PathBuf>,
    /// We opened the driver (false: someone else in the process had).
    opened_by_us: bool,
}

#[derive(Debug, Default)]
struct State {
    refs: usize,
    session: Option<Session>,
}

/// Reference-counted driver state.
pub(crate) struct DriverCore<D: DriverOps, E: EnvAccess> {
    pub ops: D,
    env: E,
    /// Where the private config directory is created.
    temp_base: Box<dyn Fn() -> PathBuf + Send + Sync>,
    /// The machine's own cuFile config, when it has one (`/etc/cufile.json`).
    site_config: Box<dyn Fn() -> Option<PathBuf> + Send + Sync>,
    state: Mutex<State>,
    /// Registered device buffers. Transfers hold a read lock for their whole
    /// run, so deregistering waits for the transfers that use the table.
    pub regions: RwLock<RegionMap>,
}

/// One reference on the driver; dropping it releases the reference.
pub(crate) struct CoreGuard<'a, D: DriverOps, E: EnvAccess> {
    core: &'a DriverCore<D, E>,
}

impl<D: DriverOps, E: EnvAccess> Drop for CoreGuard<'_, D, E> {
    fn drop(&mut self) {
        self.core.release();
    }
}

impl<'a, D: DriverOps, E: EnvAccess> CoreGuard<'a, D, E> {
    pub fn core(&self) -> &'a DriverCore<D, E> {
        self.core
    }
}

impl<D: DriverOps, E: EnvAccess> DriverCore<D, E> {
    pub fn new(ops: D, env: E, temp_base: Box<dyn Fn() -> PathBuf + Send + Sync>) -> Self {
        DriverCore {
            ops,
            env,
            temp_base,
            site_config: Box::new(|| None),
            state: Mutex::new(State::default()),
            regions: RwLock::new(RegionMap::new()),
        }
    }

    /// Uses `site_config` to find the machine's own cuFile config.
    pub fn with_site_config(mut self, site_config: Box<dyn Fn() -> Option<PathBuf> + Send + Sync>) -> Self {
        self.site_config = site_config;
        self
    }

    /// How many guards hold the driver open.
    pub fn refs(&self) -> usize {
        self.state.lock().refs
    }

    /// The knobs the open driver was configured with.
    pub fn knobs(&self) -> Option<DriverKnobs> {
        self.state.lock().session.as_ref().map(|s| s.knobs)
    }

    /// The last `max` lines cuFile logged into our config directory while
    /// open (empty when closed, or when the user's config sends it elsewhere).
    pub fn log_tail(&self, max: usize) -> Vec<String> {
        self.state.lock().session.as_ref().and_then(|s| s.config.as_ref().map(|c| c.log_lines(max))).unwrap_or_default()
    }

    /// The config file in use while open (`None`: closed, or the user's own).
    pub fn config_file(&self) -> Option<PathBuf> {
        self.state.lock().session.as_ref().and_then(|s| s.config.as_ref().map(|c| c.file().to_path_buf()))
    }

    /// Takes a reference; the first one opens the driver with `knobs`.
    /// [`crate::Error::InvalidArgument`] for bad knobs, else [`crate::Error::Gds`].
    pub fn acquire(&self, knobs: DriverKnobs) -> crate::Result<CoreGuard<'_, D, E>> {
        knobs.validate()?;
        Ok(self.acquire_valid(knobs)?)
    }

    /// [`DriverCore::acquire`] for knobs known to be valid.
    fn acquire_valid(&self, knobs: DriverKnobs) -> Result<CoreGuard<'_, D, E>, GdsError> {
        let mut st = self.state.lock();
        if st.refs == 0 {
            self.ops.ready()?;
            st.session = Some(self.open_session(knobs)?);
        } else if let Some(s) = &st.session {
            if s.knobs != knobs {
                crate::log::info_once(
                    "gds-driver-knobs",
                    &format!(
                        "the cuFile driver is already open with {:?}; a handle asking for {:?} shares it \
                         (only the first handle's queue depth, parallelism and block size configure cuFile)",
                        s.knobs, knobs
                    ),
                );
            }
        }
        st.refs += 1;
        Ok(CoreGuard { core: self })
    }

    fn open_session(&self, knobs: DriverKnobs) -> Result<Session, GdsError> {
        let (config, env_value) = match self.env.get(CUFILE_ENV_PATH_JSON) {
            Some(user) => {
                crate::log::info_once(
                    "gds-user-cufile-json",
                    &format!(
                        "{CUFILE_ENV_PATH_JSON} is set to {}; cuFile uses that config, and the handle's \
                         queue_depth/intra_op_parallelism are not written into one",
                        PathBuf::from(user).display()
                    ),
                );
                (None, None)
            }
            // A GDS machine's /etc/cufile.json holds its tuning (RDMA devices,
            // file-system sections, compat mode); a file of ours would replace
            // it wholesale, so it wins. (DeepSpeed's own file was never read.)
            None if (self.site_config)().is_some() => {
                let site = (self.site_config)().unwrap_or_default();
                crate::log::info_once(
                    "gds-site-cufile-json",
                    &format!(
                        "using this machine's cuFile config {}; the handle's queue_depth/intra_op_parallelism \
                         are not written into one",
                        site.display()
                    ),
                );
                (None, None)
            }
            None => {
                // The private directory holds cuFile's log either way (and
                // the config file, read only through the fallback).
                let cfg = ConfigDir::create(&(self.temp_base)(), &knobs)?;
                let by_parameters = self.ops.set_parameters(&knobs, cfg.dir()).unwrap_or_else(|e| {
                    // E.g. the driver is already open (another library in
                    // the process): cuFile then takes no parameters, and the
                    // open below shares that driver as before.
                    crate::log::info_once(
                        "gds-parameter-api",
                        &format!("cuFile's parameter API refused the config ({e}); using a config file instead"),
                    );
                    false
                });
                if by_parameters {
                    (Some(cfg), None)
                } else {
                    let file = cfg.file().to_path_buf();
                    self.env.set(CUFILE_ENV_PATH_JSON, &file);
                    (Some(cfg), Some(file))
                }
            }
        };
        let mut session = Session { knobs, config, env_value, opened_by_us: false };
        match self.ops.open() {
            Ok(ours) => session.opened_by_us = ours,
            Err(e) => {
                let log = session.config.as_ref().map(|c| c.log_lines(12)).unwrap_or_default();
                self.end_session(session);
                return Err(GdsError::DriverOpen { source: Box::new(e), log });
            }
        }
        if !session.opened_by_us {
            crate::log::info_once(
                "gds-driver-shared",
                "the cuFile driver was already open in this process (by another library); sharing it, \
                 so this process's cuFile config is the one it was opened with",
            );
        }
        let kb = knobs.max_direct_io_kb();
        if let Err(e) = self.ops.set_max_direct_io_kb(kb) {
            self.close_driver(session.opened_by_us);
            self.end_session(session);
            return Err(GdsError::DirectIoSize { source: Box::new(e), block_size: knobs.block_size });
        }
        Ok(session)
    }

    /// Undoes what `open_session` did to the environment and the disk.
    fn end_session(&self, session: Session) {
        if let Some(ours) = &session.env_value {
            // Only take the variable back if nobody replaced it meanwhile.
            if self.env.get(CUFILE_ENV_PATH_JSON).is_some_and(|v| std::path::Path::new(&v) == ours.as_path()) {
                self.env.remove(CUFILE_ENV_PATH_JSON);
            }
        }
        if let Some(cfg) = &session.config {
            for line in cfg.log_lines(50) {
                crate::log::info(&format!("cuFile log: {line}"));
            }
        }
        drop(session); // removes the config directory
    }

    fn release(&self) {
        let mut st = self.state.lock();
        if st.refs == 0 {
            return;
        }
        st.refs -= 1;
        if st.refs > 0 {
            return;
        }
        let leftovers = {
            let mut regions = self.regions.write();
            if regions.is_empty() {
                (0, Vec::new())
            } else {
                (regions.len(), regions.clear(&self.ops))
            }
        };
        if leftovers.0 > 0 {
            crate::log::info(&format!(
                "closing the cuFile driver with {} device buffer(s) still registered; deregistered them",
                leftovers.0
            ));
        }
        for e in leftovers.1 {
            crate::log::error(&e.to_string());
        }
        let session = st.session.take();
        self.close_driver(session.as_ref().is_some_and(|s| s.opened_by_us));
        if let Some(session) = session {
            self.end_session(session);
        }
    }

    /// `ops.close()`, which also lets go of per-device state; the cuFile
    /// driver itself is closed only when `opened_by_us`.
    fn close_driver(&self, opened_by_us: bool) {
        if let Err(e) = self.ops.close(opened_by_us) {
            crate::log::error(&e.to_string());
        }
    }

    /// Opens the driver with DeepSpeed's default knobs (as a first handle
    /// would) and closes it again, unless it is open already. For [`super::available::probe`].
    pub fn check_open(&self) -> Result<(), GdsError> {
        self.acquire_valid(DriverKnobs::DEFAULT).map(drop)
    }

    pub fn register(&self, ptr: u64, len: usize) -> Result<RegisterOutcome, GdsError> {
        self.regions.write().register(&self.ops, ptr, len)
    }

    pub fn deregister(&self, ptr: u64) -> Result<bool, GdsError> {
        self.regions.write().deregister(&self.ops, ptr)
    }

    pub fn regions(&self) -> RwLockReadGuard<'_, RegionMap> {
        self.regions.read()
    }
}

/// A CUDA context pointer that may cross threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ctx(pub CuContext);
// SAFETY: a CUcontext is a handle that any thread may make current.
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

impl Ctx {
    /// The raw `CUcontext` (a method, so closures capture the whole `Ctx`).
    pub fn raw(self) -> CuContext {
        self.0
    }
}

/// Makes a context current on the calling thread and puts the previous one
/// back on drop.
pub(crate) struct CurrentContext<'a> {
    gpu: &'a Gpu,
    previous: Option<CuContext>,
}

impl<'a> CurrentContext<'a> {
    pub fn enter(gpu: &'a Gpu, ctx: Ctx) -> Result<CurrentContext<'a>, GdsError> {
        let prev = gpu.cuda.current_context()?;
        if prev == ctx.0 {
            return Ok(CurrentContext { gpu, previous: None });
        }
        gpu.cuda.set_current(ctx.0)?;
        Ok(CurrentContext { gpu, previous: Some(prev) })
    }
}

impl Drop for CurrentContext<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.previous {
            if let Err(e) = self.gpu.cuda.set_current(prev) {
                crate::log::error(&format!("restoring the caller's CUDA context: {e}"));
            }
        }
    }
}

/// The real driver calls: cuFile through the loaded libcufile, with each
/// device's primary context (the one torch uses) retained once and made
/// current around the calls that touch device memory.
#[derive(Default)]
pub(crate) struct CuFileOps {
    contexts: Mutex<BTreeMap<i32, Ctx>>,
}

impl CuFileOps {
    fn gpu(&self) -> Result<&'static Gpu, GdsError> {
        environment()
    }

    /// Device `ordinal`'s primary context, retained on first use and kept
    /// until the driver closes.
    pub fn context(&self, ordinal: i32) -> Result<Ctx, GdsError> {
        let gpu = self.gpu()?;
        if ordinal < 0 || ordinal >= gpu.devices {
            return Err(GdsError::NoSuchDevice { ordinal, visible: gpu.devices });
        }
        let mut map = self.contexts.lock();
        if let Some(c) = map.get(&ordinal) {
            return Ok(*c);
        }
        let ctx = Ctx(gpu.cuda.retain_primary(ordinal)?);
        map.insert(ordinal, ctx);
        Ok(ctx)
    }
}

impl Registrar for CuFileOps {
    fn device_of(&self, ptr: u64) -> Result<i32, GdsError> {
        self.gpu()?.cuda.pointer_device(ptr)
    }
    fn register(&self, ptr: u64, len: usize, device: i32) -> Result<(), GdsError> {
        let gpu = self.gpu()?;
        let _cur = CurrentContext::enter(gpu, self.context(device)?)?;
        gpu.cufile.buf_register(ptr, len, &gpu.cuda)
    }
    fn deregister(&self, ptr: u64, device: i32) -> Result<(), GdsError> {
        let gpu = self.gpu()?;
        let _cur = CurrentContext::enter(gpu, self.context(device)?)?;
        gpu.cufile.buf_deregister(ptr, &gpu.cuda)
    }
}

impl DriverOps for CuFileOps {
    fn ready(&self) -> Result<(), GdsError> {
        self.gpu().map(|_| ())
    }
    fn open(&self) -> Result<bool, GdsError> {
        let gpu = self.gpu()?;
        gpu.cufile.driver_open(&gpu.cuda)
    }
    fn set_max_direct_io_kb(&self, kb: usize) -> Result<(), GdsError> {
        let gpu = self.gpu()?;
        gpu.cufile.set_max_direct_io_size_kb(kb, &gpu.cuda)
    }
    fn set_parameters(&self, knobs: &DriverKnobs, log_dir: &std::path::Path) -> Result<bool, GdsError> {
        let gpu = self.gpu()?;
        gpu.cufile.set_parameters(knobs, log_dir, &gpu.cuda)
    }
    fn close(&self, close_driver: bool) -> Result<(), GdsError> {
        let gpu = self.gpu()?;
        let mut errors = Vec::new();
        if close_driver {
            errors.extend(gpu.cufile.driver_close(&gpu.cuda).err());
        }
        for (ordinal, _) in std::mem::take(&mut *self.contexts.lock()) {
            errors.extend(gpu.cuda.release_primary(ordinal).err());
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(GdsError::Several(errors)),
        }
    }
}

/// The process's driver.
pub(crate) fn global() -> &'static DriverCore<CuFileOps, ProcessEnv> {
    static CORE: std::sync::OnceLock<DriverCore<CuFileOps, ProcessEnv>> = std::sync::OnceLock::new();
    CORE.get_or_init(|| {
        DriverCore::new(CuFileOps::default(), ProcessEnv, Box::new(super::config::temp_base))
            .with_site_config(Box::new(super::config::site_config))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gds::registry::tests::FakeRegistrar;
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
        fn set_parameters(&self, knobs: &DriverKnobs, log_dir: &std::path::Path) -> Result<bool, GdsError> {
            if let Some(e) = self.fail_parameters.lock().clone() {
                return Err(e);
            }
            if self.parameter_api {
                self.log.lock().push(format!(
                    "parameters qd={} threads={} log_dir={}",
                    knobs.queue_depth,
                    knobs.intra_op_parallelism,
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

    /// With cuFile's parameter API (1.14+) the knobs and the log directory
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
        let knobs = DriverKnobs { queue_depth: 64, intra_op_parallelism: 2, block_size: 4 << 20 };
        let g = core.acquire(knobs).unwrap();
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
        let g = core.acquire(DriverKnobs::DEFAULT).unwrap();
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
        let knobs = DriverKnobs { queue_depth: 64, intra_op_parallelism: 2, block_size: 4 << 20 };
        let g1 = core.acquire(knobs).unwrap();
        let file = core.config_file().expect("a config was written");
        let dir = file.parent().unwrap().to_path_buf();
        assert!(dir.starts_with(&base) && dir != base, "private dir under the temp base");
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("\"max_io_queue_depth\": 64") && text.contains("\"max_io_threads\": 2"), "{text}");
        assert_eq!(env.get(CUFILE_ENV_PATH_JSON), Some(file.clone().into_os_string()), "env points at our file");
        assert_eq!(*core.ops.env_at_open.lock(), Some(Some(file.clone().into_os_string())), "set BEFORE open");
        assert_eq!(*core.ops.log.lock(), vec!["open".to_string(), "max_direct_io 4096".to_string()]);

        let g2 = core.acquire(DriverKnobs::DEFAULT).unwrap();
        assert_eq!(core.refs(), 2);
        assert_eq!(core.knobs(), Some(knobs), "the first handle's knobs stay");
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
        let g = core.acquire(knobs).unwrap();
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
        let g = core.acquire(DriverKnobs::DEFAULT).unwrap();
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
        let g = core.acquire(DriverKnobs::DEFAULT).unwrap();
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
        let err = core.acquire(DriverKnobs::DEFAULT).err().expect("open fails");
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
        let g = core.acquire(DriverKnobs::DEFAULT).unwrap();
        assert_eq!(core.refs(), 1);
        drop(g);
        std::fs::remove_dir_all(&base).ok();
    }

    #[test]
    fn a_refused_direct_io_size_closes_again() {
        let (core, env, base) = setup("failsize");
        *core.ops.fail_size.lock() = Some(GdsError::cufile("cuFileDriverSetMaxDirectIOSize(1 KiB)", 5022, None, 0));
        let err = core.acquire(DriverKnobs { block_size: 1024, ..DriverKnobs::DEFAULT }).err().unwrap();
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
        let err = core.acquire(DriverKnobs::DEFAULT).err().unwrap();
        assert!(matches!(err, crate::Error::Gds(GdsError::LibraryNotFound { .. })), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("libcuda"), "{err}");
        assert!(core.ops.log.lock().is_empty(), "cuFileDriverOpen never called");
        assert_eq!(env.get(CUFILE_ENV_PATH_JSON), None);
        assert_eq!(entries(&base), 0);
        let err = core.acquire(DriverKnobs { queue_depth: 0, ..DriverKnobs::DEFAULT }).err().unwrap();
        assert!(matches!(&err, crate::Error::InvalidArgument(m) if m.contains("queue_depth")), "{err:?}");
        assert!(core.check_open().is_err(), "the probe's check says the same as acquire");
        std::fs::remove_dir_all(&base).ok();
    }

    #[test]
    fn a_driver_opened_by_someone_else_is_shared_not_closed() {
        let (core, _env, base) = setup("shared");
        *core.ops.already_open.lock() = true;
        let g = core.acquire(DriverKnobs::DEFAULT).unwrap();
        drop(g);
        assert_eq!(*core.ops.log.lock(), vec!["open", "max_direct_io 1024", "release-only"]);
        assert_eq!(entries(&base), 0);
        std::fs::remove_dir_all(&base).ok();
    }

    #[test]
    fn closing_deregisters_leftover_buffers() {
        let (core, _env, base) = setup("leftovers");
        let g = core.acquire(DriverKnobs::DEFAULT).unwrap();
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
                        let g = core.acquire(DriverKnobs::DEFAULT).unwrap();
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
}
