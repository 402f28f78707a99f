//! Panics stop at the GDS entry points: every call that crosses into C++
//! or Python runs under [`catch_gds`] or [`catch`], and a panic comes back
//! as [`GdsError::Internal`] with its text.

use crate::gds::error::GdsError;
use crate::error::{catch_unwind_text, Result};

/// Runs `f`, turning a panic into [`GdsError::Internal`] (nothing may
/// unwind across the FFI boundary into C++ or Python).
pub(crate) fn catch_gds<T>(f: impl FnOnce() -> std::result::Result<T, GdsError>) -> std::result::Result<T, GdsError> {
    catch_unwind_text(f).unwrap_or_else(|text| Err(GdsError::Internal(text)))
}

/// [`catch_gds`] for the entry points that return the crate's [`Result`].
pub(crate) fn catch<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind_text(f).unwrap_or_else(|text| Err(GdsError::Internal(text).into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn panics_become_errors() {
        let r: std::result::Result<(), GdsError> = catch_gds(|| panic!("boom {}", 7));
        match r {
            Err(GdsError::Internal(m)) => assert_eq!(m, "boom 7"),
            other => panic!("{other:?}"),
        }
        let r: Result<()> = catch(|| panic!("static str"));
        match r {
            Err(e @ Error::Gds(GdsError::Internal(_))) => {
                assert_eq!(e.to_string(), "GPUDirect Storage: internal error in deepnvme::gds (caught panic): static str");
                let source = std::error::Error::source(&e).expect("the GdsError is the source");
                assert!(source.to_string().starts_with("internal error in deepnvme::gds"), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }

}
