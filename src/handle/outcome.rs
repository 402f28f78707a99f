//! What a call that finishes ops reports: the first error of the ops it
//! finished and how many more; an op whose finishing panicked.

use crate::error::{panic_text, Error, Result};

/// The errors of the ops one call finished: the first, and how many more.
#[derive(Default)]
pub(super) struct Errors {
    pub(super) first: Option<Error>,
    pub(super) more: usize,
}

impl Errors {
    pub(super) fn add(&mut self, e: Error) {
        if self.first.is_none() {
            self.first = Some(e);
        } else {
            self.more += 1;
        }
    }
    /// Logs the errors a call found before it was cut short (they would
    /// otherwise be lost with it).
    pub(super) fn log_dropped(&mut self) {
        if let Some(e) = self.first.take() {
            crate::rt::log::error(&format!("{e} (an op finished by a call that was then interrupted)"));
        }
    }

    pub(super) fn into_result(self, completed: usize) -> Result<usize> {
        match self.first {
            None => Ok(completed),
            Some(e) if self.more == 0 => Err(e),
            Some(e) => Err(Error::Many {
                first: Box::new(e),
                more: self.more,
            }),
        }
    }
}

/// An op whose finishing panicked fails, naming the panic (its waiters
/// still see it finished).
pub(super) fn finish_panic(payload: &(dyn std::any::Any + Send)) -> Error {
    Error::Engine(format!("internal error (panic) while finishing an op: {}", panic_text(payload)))
}

/// What a blocking windowed call returns: the earlier ops finished first,
/// and the windowed op itself.
pub(super) fn combine(earlier: Result<usize>, this: Result<()>) -> Result<usize> {
    let mut errors = Errors::default();
    let completed = match earlier {
        Ok(n) => n,
        Err(Error::Many { first, more }) => {
            errors.first = Some(*first);
            errors.more = more;
            0
        }
        Err(e) => {
            errors.add(e);
            0
        }
    };
    if let Err(e) = this {
        errors.add(e);
    }
    errors.into_result(completed + 1)
}
