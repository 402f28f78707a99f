//! What a `cuFileRead`/`cuFileWrite` return value means ([`interpret`]):
//! bytes moved, a call to repeat, or a failure with its errno and reason.

use crate::gds::shim::status::{cufile_op_errno, cufile_op_error_name, CUFILEOP_BASE_ERR};
use crate::error::{errno_text, Direction};

/// What one cuFileRead/cuFileWrite return value means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallOutcome {
    /// This many bytes moved (at least 1).
    Moved(usize),
    /// Interrupted; call again.
    Retry,
    /// Failed: errno and what happened.
    Failed { errno: i32, detail: String },
}

/// Reads a cuFile I/O return: bytes moved; `-1` with `errno` for a POSIX
/// error; `-errno` for small negatives; `-CU_FILE_*` (beyond 5000) for a
/// cuFile error. 0 bytes is an end of file for a read, a stall for a write.
pub(crate) fn interpret(call: &str, direction: Direction, ret: isize, errno: i32, asked: usize) -> CallOutcome {
    if ret > 0 {
        let n = ret as usize;
        if n > asked {
            return CallOutcome::Failed {
                errno: libc::EIO,
                detail: format!("{call} reported {n} bytes moved, more than the {asked} asked"),
            };
        }
        return CallOutcome::Moved(n);
    }
    if ret == 0 {
        return match direction {
            Direction::Read => {
                CallOutcome::Failed { errno: libc::ENODATA, detail: format!("{call}: unexpected end of file") }
            }
            Direction::Write => {
                CallOutcome::Failed { errno: libc::EIO, detail: format!("{call}: the device accepted no bytes") }
            }
        };
    }
    let code = -(ret as i64);
    let posix = if code == 1 {
        if errno != 0 {
            errno
        } else {
            libc::EIO
        }
    } else if code < CUFILEOP_BASE_ERR {
        code as i32
    } else {
        0
    };
    if posix != 0 {
        if posix == libc::EINTR || posix == libc::EAGAIN {
            return CallOutcome::Retry;
        }
        return CallOutcome::Failed {
            errno: posix,
            detail: format!("{call} returned {ret}: POSIX errno {posix} ({})", errno_text(posix)),
        };
    }
    let (name, meaning) = cufile_op_error_name(code);
    CallOutcome::Failed {
        errno: cufile_op_errno(code),
        detail: format!("{call} returned {ret}: cuFile {name}: {meaning}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_values_are_read_as_bytes_errno_or_cufile_errors() {
        use Direction::*;
        assert_eq!(interpret("cuFileRead", Read, 4096, 0, 8192), CallOutcome::Moved(4096));
        assert!(
            matches!(interpret("cuFileRead", Read, 9000, 0, 8192), CallOutcome::Failed { errno, .. } if errno == libc::EIO)
        );
        match interpret("cuFileRead", Read, 0, 0, 8192) {
            CallOutcome::Failed { errno, detail } => {
                assert_eq!(errno, libc::ENODATA);
                assert!(detail.contains("end of file"));
            }
            o => panic!("{o:?}"),
        }
        assert!(
            matches!(interpret("cuFileWrite", Write, 0, 0, 1), CallOutcome::Failed { errno, .. } if errno == libc::EIO)
        );
        match interpret("cuFileWrite", Write, -1, libc::ENOSPC, 1) {
            CallOutcome::Failed { errno, detail } => {
                assert_eq!(errno, libc::ENOSPC);
                assert!(detail.contains("POSIX") && detail.contains("errno 28"), "{detail}");
            }
            o => panic!("{o:?}"),
        }
        assert!(
            matches!(interpret("cuFileRead", Read, -1, 0, 1), CallOutcome::Failed { errno, .. } if errno == libc::EIO)
        );
        assert_eq!(interpret("cuFileRead", Read, -1, libc::EINTR, 1), CallOutcome::Retry);
        assert_eq!(interpret("cuFileRead", Read, -(libc::EAGAIN as isize), 0, 1), CallOutcome::Retry);
        assert!(
            matches!(interpret("cuFileRead", Read, -(libc::EINVAL as isize), 0, 1), CallOutcome::Failed { errno, .. } if errno == libc::EINVAL)
        );
        match interpret("cuFileRead", Read, -5020, 0, 1) {
            CallOutcome::Failed { errno, detail } => {
                assert_eq!(errno, libc::EINVAL);
                assert!(detail.contains("CU_FILE_DIO_NOT_SET") && detail.contains("-5020"), "{detail}");
            }
            o => panic!("{o:?}"),
        }
        match interpret("cuFileRead", Read, -5044, 0, 1) {
            CallOutcome::Failed { errno, detail } => {
                assert_eq!(errno, libc::EIO);
                assert!(detail.contains("CU_FILE_IO_ERROR"), "{detail}");
            }
            o => panic!("{o:?}"),
        }
    }
}
