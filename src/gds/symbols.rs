//! Entry points a library must have: the first of a symbol's names that
//! the library exports, or a [`GdsError::MissingSymbol`] naming them all.

use super::dl::{function, Library};
use super::error::{GdsError, GdsLibrary};

/// The first of `names` that `lib` (`library`, loaded from `path`) has.
pub(crate) fn need<F: Copy>(lib: &Library, library: GdsLibrary, path: &str, names: &[&str]) -> Result<F, GdsError> {
    for n in names {
        // SAFETY: each caller pairs the symbol names with their C signature F.
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
