//! The process-wide cuFile driver: opened by the first guard, closed with the
//! last, whatever extension or thread holds them.
//!
//! [`DriverCore`] is the bookkeeping (reference count, config directory,
//! `CUFILE_ENV_PATH_JSON`, registered buffers); the calls into cuFile and
//! the environment go through [`DriverOps`] and [`EnvAccess`], so that the
//! open/close rules are tested without a GPU. The one real instance
//! ([`crate::gds::driver::cufile_ops`]) uses cuFile and the process environment.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::rt::sync::{Mutex, RwLock, RwLockReadGuard};

use crate::gds::shim::config::{ConfigDir, DriverSettings, CUFILE_ENV_PATH_JSON};
use crate::gds::error::GdsError;
use crate::gds::driver::registry::{RegionMap, RegisterOutcome, Registrar};

/// The cuFile driver calls (real: [`crate::gds::driver::cufile_ops::CuFileOps`]).
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
    fn set_parameters(&self, settings: &DriverSettings, log_dir: &std::path::Path) -> Result<bool, GdsError>;
    /// Releases per-device state, and closes the driver when `close_driver`.
    fn close(&self, close_driver: bool) -> Result<(), GdsError>;
}

/// The environment variables the driver reads and sets.
pub(crate) trait EnvAccess: Send + Sync {
    fn get(&self, key: &str) -> Option<OsString>;
    fn set(&self, key: &str, value: &std::path::Path);
    fn remove(&self, key: &str);
}

/// What the driver was opened with.
#[derive(Debug)]
struct Session {
    settings: DriverSettings,
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

    /// The settings the open driver was configured with.
    pub fn settings(&self) -> Option<DriverSettings> {
        self.state.lock().session.as_ref().map(|s| s.settings)
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

    /// Takes a reference; the first one opens the driver with `settings`.
    /// [`crate::Error::InvalidArgument`] for bad settings, else [`crate::Error::Gds`].
    pub fn acquire(&self, settings: DriverSettings) -> crate::Result<CoreGuard<'_, D, E>> {
        settings.validate()?;
        Ok(self.acquire_valid(settings)?)
    }

    /// [`DriverCore::acquire`] for settings known to be valid.
    fn acquire_valid(&self, settings: DriverSettings) -> Result<CoreGuard<'_, D, E>, GdsError> {
        let mut st = self.state.lock();
        if st.refs == 0 {
            self.ops.ready()?;
            st.session = Some(self.open_session(settings)?);
        } else if let Some(s) = &st.session {
            if s.settings != settings {
                crate::rt::log::info_once(
                    "gds-driver-settings",
                    &format!(
                        "the cuFile driver is already open with {:?}; a handle asking for {:?} shares it \
                         (only the first handle's queue depth, parallelism and block size configure cuFile)",
                        s.settings, settings
                    ),
                );
            }
        }
        st.refs += 1;
        Ok(CoreGuard { core: self })
    }

    fn open_session(&self, settings: DriverSettings) -> Result<Session, GdsError> {
        let (config, env_value) = match self.env.get(CUFILE_ENV_PATH_JSON) {
            Some(user) => {
                crate::rt::log::info_once(
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
                crate::rt::log::info_once(
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
                let cfg = ConfigDir::create(&(self.temp_base)(), &settings)?;
                let by_parameters = self.ops.set_parameters(&settings, cfg.dir()).unwrap_or_else(|e| {
                    // E.g. the driver is already open (another library in
                    // the process): cuFile then takes no parameters, and the
                    // open below shares that driver as before.
                    crate::rt::log::info_once(
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
        let mut session = Session { settings, config, env_value, opened_by_us: false };
        match self.ops.open() {
            Ok(ours) => session.opened_by_us = ours,
            Err(e) => {
                let log = session.config.as_ref().map(|c| c.log_lines(12)).unwrap_or_default();
                self.end_session(session);
                return Err(GdsError::DriverOpen { source: Box::new(e), log });
            }
        }
        if !session.opened_by_us {
            crate::rt::log::info_once(
                "gds-driver-shared",
                "the cuFile driver was already open in this process (by another library); sharing it, \
                 so this process's cuFile config is the one it was opened with",
            );
        }
        let kb = settings.max_direct_io_kb();
        if let Err(e) = self.ops.set_max_direct_io_kb(kb) {
            self.close_driver(session.opened_by_us);
            self.end_session(session);
            return Err(GdsError::DirectIoSize { source: Box::new(e), block_size: settings.block_size });
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
                crate::rt::log::info(&format!("cuFile log: {line}"));
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
            crate::rt::log::info(&format!(
                "closing the cuFile driver with {} device buffer(s) still registered; deregistered them",
                leftovers.0
            ));
        }
        for e in leftovers.1 {
            crate::rt::log::error(&e.to_string());
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
            crate::rt::log::error(&e.to_string());
        }
    }

    /// Opens the driver with DeepSpeed's default settings (as a first handle
    /// would) and closes it again, unless it is open already. For [`crate::gds::available::probe`].
    pub fn check_open(&self) -> Result<(), GdsError> {
        self.acquire_valid(DriverSettings::DEFAULT).map(drop)
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

#[cfg(test)]
mod tests;
