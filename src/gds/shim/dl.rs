//! Just enough `dlopen`/`dlsym` to load libcufile and libcuda by hand.
//!
//! Generic loaders (cudarc's dynamic loading, for one) panic when a library
//! or a symbol is missing, and cudarc's list of names lacks `libcufile.so.0`
//! (the soname every NVIDIA build of cuFile carries, and the one torch links
//! against). Loading here turns every miss into a [`LoadFailure`] instead.
//!
//! Libraries are never unloaded: libcufile and libcuda keep threads and
//! global state that do not survive `dlclose`, and the process-wide driver
//! keeps using them for the life of the process.

use std::ffi::{c_void, CStr, CString};

/// One name `dlopen` was given, and why it did not load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadFailure {
    /// The name or path tried.
    pub name: String,
    /// `dlerror()`'s text, without the name glibc puts in front.
    pub dlerror: String,
}

impl LoadFailure {
    /// The file simply is not there (as opposed to a file that is not a
    /// loadable library, or one whose dependencies are missing).
    pub fn is_not_found(&self) -> bool {
        self.dlerror.contains("No such file or directory")
    }
}

/// A loaded shared library. Dropping it does not unload it.
pub(crate) struct Library {
    handle: *mut c_void,
    /// The name or path it was opened by.
    pub name: String,
}

// SAFETY: a dlopen handle is an opaque token of the dynamic loader, which
// lets any thread use it (dlsym/dladdr are thread-safe in glibc).
unsafe impl Send for Library {}
// SAFETY: `Library` is only read after it is made (dlsym through `&self`),
// and those calls are thread-safe.
unsafe impl Sync for Library {}

/// The text of the calling thread's last dl* error, without the leading
/// "name: " that glibc repeats.
fn dl_error(name: &str) -> String {
    // SAFETY: dlerror returns a thread-local, NUL-terminated string or NULL.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown dlopen error".to_string();
    }
    // SAFETY: non-NULL dlerror text is a valid C string until the next dl* call.
    let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    match text.strip_prefix(name).and_then(|t| t.strip_prefix(": ")) {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

impl Library {
    /// `dlopen(name, RTLD_NOW | RTLD_LOCAL)`. A bare name is searched the
    /// way the dynamic linker does (already-loaded objects by soname first,
    /// then RPATH/LD_LIBRARY_PATH/ld.so.cache); a name with a '/' is a path.
    pub fn open(name: &str) -> Result<Library, LoadFailure> {
        let fail = |dlerror: String| LoadFailure { name: name.to_string(), dlerror };
        let c = CString::new(name).map_err(|_| fail("the name contains a NUL byte".to_string()))?;
        // SAFETY: clears any stale error; dlopen gets a valid C string.
        let handle = unsafe {
            libc::dlerror();
            libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL)
        };
        if handle.is_null() {
            return Err(fail(dl_error(name)));
        }
        Ok(Library { handle, name: name.to_string() })
    }

    /// The address of `symbol`, or `None` when the library lacks it.
    pub fn raw_symbol(&self, symbol: &str) -> Option<*mut c_void> {
        let c = CString::new(symbol).ok()?;
        // SAFETY: a live handle and a valid C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// The file this library was loaded from, found through one of its
    /// symbols (for messages; `None` when the loader does not say).
    pub fn path_of(&self, symbol: &str) -> Option<String> {
        let addr = self.raw_symbol(symbol)?;
        // SAFETY: Dl_info is plain C data (pointers and integers), for which
        // all-zero bytes are a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `addr` is a symbol address inside a loaded object; `info` is writable.
        if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dladdr filled a valid C string owned by the loader.
        Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
    }
}

/// Resolves `symbol` into the function pointer type `F`.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` type whose signature matches the C
/// declaration of `symbol`.
pub(crate) unsafe fn function<F: Copy>(lib: &Library, symbol: &str) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    let p = lib.raw_symbol(symbol)?;
    // SAFETY: the caller guarantees F is a matching function pointer type, of pointer size.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// Opens the first candidate that loads; on failure, why each one did not
/// (in order).
pub(crate) fn open_first(candidates: &[String]) -> Result<Library, Vec<LoadFailure>> {
    let mut failures = Vec::new();
    for name in candidates {
        match Library::open(name) {
            Ok(lib) => return Ok(lib),
            Err(why) => failures.push(why),
        }
    }
    Err(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_first_lists_every_name_tried() {
        let names = vec!["libdeepnvme-nonexistent-a.so.0".to_string(), "/nonexistent/dir/libb.so".to_string()];
        let failures = open_first(&names).err().expect("bogus names must not load");
        let tried: Vec<&str> = failures.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(tried, ["libdeepnvme-nonexistent-a.so.0", "/nonexistent/dir/libb.so"]);
        assert!(failures.iter().all(|f| f.is_not_found()), "{failures:?}");
        let err = crate::gds::error::describe_attempts(&failures);
        assert!(err.starts_with("not found: libdeepnvme-nonexistent-a.so.0, /nonexistent/dir/libb.so"), "{err}");
    }

    #[test]
    fn open_first_takes_the_first_that_loads_and_resolves_symbols() {
        let names = vec!["libdeepnvme-nonexistent.so".to_string(), "libc.so.6".to_string()];
        let lib = open_first(&names).expect("libc loads");
        assert_eq!(lib.name, "libc.so.6");
        type Getpid = unsafe extern "C" fn() -> libc::pid_t;
        // SAFETY: getpid's C signature is `pid_t getpid(void)`.
        let getpid: Getpid = unsafe { function(&lib, "getpid") }.expect("getpid is in libc");
        // SAFETY: getpid takes nothing and cannot fail.
        assert_eq!(unsafe { getpid() }, std::process::id() as libc::pid_t);
        // SAFETY: no such symbol, so no pointer is made (and the type is getpid's anyway).
        assert!(unsafe { function::<Getpid>(&lib, "deepnvme_no_such_symbol") }.is_none());
        assert!(lib.path_of("getpid").is_some_and(|p| p.contains("libc")));
    }

    #[test]
    fn a_file_that_is_not_a_library_is_reported_with_its_reason() {
        let dir = std::env::temp_dir().join(format!("deepnvme-dl-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("libcufile.so.0");
        std::fs::write(&fake, b"not an ELF file").unwrap();
        let failures = open_first(&[fake.display().to_string()]).err().expect("garbage must not load");
        std::fs::remove_dir_all(&dir).ok();
        assert!(!failures[0].is_not_found() && !failures[0].dlerror.is_empty(), "{failures:?}");
        let err = crate::gds::error::describe_attempts(&failures);
        assert!(err.starts_with("failed to load:"), "{err}");
        assert!(err.contains("libcufile.so.0"), "{err}");
    }
}
