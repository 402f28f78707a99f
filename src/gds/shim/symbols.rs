//! Entry points a library must have: the first of a symbol's names that
//! the library exports, or a [`GdsError::MissingSymbol`] naming them all.

use crate::gds::shim::dl::{function, Library};
use crate::gds::error::{GdsError, GdsLibrary};

/// The first of `names` that `lib` (`library`, loaded from `path`) has, as
/// the function pointer type `F`.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` type whose signature matches the
/// real C declaration of every symbol in `names` (they are one entry
/// point's names, such as `cuFileDriverClose_v2` and `cuFileDriverClose`):
/// nothing checks it, and calling through a mismatched type is undefined
/// behaviour.
pub(crate) unsafe fn need<F: Copy>(
    lib: &Library,
    library: GdsLibrary,
    path: &str,
    names: &[&str],
) -> Result<F, GdsError> {
    for n in names {
        // SAFETY: the caller vouches that F is the C declaration of `n`.
        if let Some(f) = unsafe { function::<F>(lib, n) } {
            return Ok(f);
        }
    }
    Err(GdsError::MissingSymbol {
        library,
        path: path.to_string(),
        symbols: names.iter().map(|n| n.to_string()).collect(),
        other: None,
    })
}
