//! Regression tests for lifetimes and failure containment in the handle:
//! * the caller's handle on a direct (pinned) buffer lives until `wait()`
//!   finishes the op — torch must not free and reuse the memory under the I/O;
//! * a slice that panics fails its op (an error from `wait()`), it does not
//!   hang `wait()` or the handle's drop, and the handle keeps working;
//! * an async submit does not wait behind another thread's blocking call.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use deepnvme::{Direction, FileTarget, OpRequest, Result, Staging};

/// Stands for the torch glue's reference to a tensor: records when it is let go.
struct TensorRef {
    released: Arc<AtomicBool>,
}

impl Staging for TensorRef {
    fn copy_to_bounce(&mut self, _bounce: &mut [u8]) -> Result<()> {
        panic!("a pinned buffer must not bounce")
    }
    fn copy_from_bounce(&mut self, _bounce: &[u8]) -> Result<()> {
        panic!("a pinned buffer must not bounce")
    }
}

impl Drop for TensorRef {
    fn drop(&mut self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_direct_buffer_is_held_until_wait_finishes_the_op() {
    let dir = TempDir::new("keepalive");
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, true, 2);
        let data = pattern(11, 1 << 20);
        let src = Pinned::with(&data);
        let path = dir.file(&format!("k-{engine:?}.bin"));
        let released = Arc::new(AtomicBool::new(false));
        let req = OpRequest {
            direction: Direction::Write,
            target: FileTarget::Path(&path),
            file_offset: 0,
            buffer: src.desc(),
            staging: Some(Box::new(TensorRef { released: released.clone() })),
            validate: false,
        };
        assert_eq!(h.submit(req, true).unwrap(), 0);
        assert!(!released.load(Ordering::SeqCst), "{engine:?}: the tensor was let go while its op was in flight");
        assert_eq!(h.wait().unwrap(), 1);
        assert!(released.load(Ordering::SeqCst), "{engine:?}: the tensor was kept after the op finished");
        assert_bytes_eq(&read_file(&path), &data, "file after the write");
    }
}

