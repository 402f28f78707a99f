//! Retries that must end: a piece that keeps answering EAGAIN (or EINTR
//! without progress) fails naming the errno, the offset and the length.

use crate::engine::Piece;
use crate::error::Direction;
use crate::knobs;

fn piece() -> Piece {
    Piece { fd: 42, file_offset: 1 << 20, addr: std::ptr::null_mut(), len: 4096, done: 0, eagain: 0, eintr: 0 }
}

#[test]
fn repeated_eagain_fails_with_eagain_after_the_bound() {
    for direction in [Direction::Read, Direction::Write] {
        let mut p = piece();
        // Some progress first: the error names where the piece stopped.
        assert_eq!(p.complete(direction, 1000), Ok(false));
        let start = std::time::Instant::now();
        let mut retries = 0u32;
        let err = loop {
            match p.complete(direction, -(libc::EAGAIN as i64)) {
                Ok(false) => retries += 1,
                Ok(true) => panic!("EAGAIN completed the piece"),
                Err(e) => break e,
            }
            assert!(retries <= 10 * knobs::MAX_EAGAIN_RETRIES, "EAGAIN is retried without bound");
        };
        assert_eq!(retries, knobs::MAX_EAGAIN_RETRIES, "retried exactly MAX_EAGAIN_RETRIES times");
        assert_eq!(err.errno, libc::EAGAIN);
        assert_eq!(err.file_offset, (1 << 20) + 1000);
        assert_eq!(err.len, 4096 - 1000);
        assert_eq!(err.fd, 42);
        let msg = err.to_string();
        assert!(msg.contains("errno 11") && msg.contains(&format!("offset {}", (1 << 20) + 1000)), "{msg}");
        // The retries backed off (they did not spin), but not for long.
        let took = start.elapsed();
        assert!(took >= std::time::Duration::from_millis(20), "no backoff: {took:?}");
        assert!(took <= std::time::Duration::from_secs(3), "backoff too long: {took:?}");
    }
}

#[test]
fn progress_resets_the_eagain_count() {
    let mut p = piece();
    for _ in 0..3 {
        for _ in 0..knobs::MAX_EAGAIN_RETRIES {
            assert_eq!(p.complete(Direction::Read, -(libc::EAGAIN as i64)), Ok(false));
        }
        assert_eq!(p.complete(Direction::Read, 1), Ok(false), "a byte of progress");
    }
    assert_eq!(p.complete(Direction::Read, 4093), Ok(true));
}

#[test]
fn eintr_without_progress_is_bounded_too() {
    let mut p = piece();
    let mut retries = 0u32;
    let err = loop {
        match p.complete(Direction::Write, -(libc::EINTR as i64)) {
            Ok(false) => retries += 1,
            Ok(true) => panic!("EINTR completed the piece"),
            Err(e) => break e,
        }
        assert!(retries <= 10 * knobs::MAX_EINTR_RETRIES, "EINTR is retried without bound");
    };
    assert_eq!(retries, knobs::MAX_EINTR_RETRIES);
    assert_eq!(err.errno, libc::EINTR);
    // A signal now and then (with progress in between) never fails a piece.
    let mut p = piece();
    for _ in 0..4096 {
        assert_eq!(p.complete(Direction::Write, -(libc::EINTR as i64)), Ok(false));
        let _ = p.complete(Direction::Write, 1);
    }
    assert_eq!(p.remaining(), 0);
}
