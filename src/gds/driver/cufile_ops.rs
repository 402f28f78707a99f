//! The one real driver: [`CuFileOps`], the cuFile calls behind
//! [`DriverOps`] through the loaded libcufile, and [`ProcessEnv`], the
//! process environment behind [`EnvAccess`]; [`global`] is the process's
//! [`DriverCore`] built from them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::OnceLock;

use crate::gds::shim::config::{site_config, temp_base, DriverSettings};
use crate::gds::shim::context::{Ctx, CurrentContext};
use crate::gds::driver::lifecycle::{DriverCore, DriverOps, EnvAccess};
use crate::gds::error::GdsError;
use crate::gds::shim::probe::{environment, Gpu};
use crate::gds::driver::registry::Registrar;
use crate::rt::sync::Mutex;


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
        let _cur = CurrentContext::enter(&gpu.cuda, self.context(device)?)?;
        gpu.cufile.buf_register(ptr, len, &gpu.cuda)
    }
    fn deregister(&self, ptr: u64, device: i32) -> Result<(), GdsError> {
        let gpu = self.gpu()?;
        let _cur = CurrentContext::enter(&gpu.cuda, self.context(device)?)?;
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
    fn set_parameters(&self, settings: &DriverSettings, log_dir: &std::path::Path) -> Result<bool, GdsError> {
        let gpu = self.gpu()?;
        gpu.cufile.set_parameters(settings, log_dir, &gpu.cuda)
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
    static CORE: OnceLock<DriverCore<CuFileOps, ProcessEnv>> = OnceLock::new();
    CORE.get_or_init(|| {
        DriverCore::new(CuFileOps::default(), ProcessEnv, Box::new(temp_base))
            .with_site_config(Box::new(site_config))
    })
}
