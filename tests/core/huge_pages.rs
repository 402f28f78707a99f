//! Memory on transparent huge pages moves every byte: locked buffers and
//! bounce windows of 2 MiB and more are 2 MiB-aligned, huge-page advised
//! mappings (src/pinned/page_buffer.rs), which the kernel pins and
//! registers in huge-page units. On real O_DIRECT files, with both
//! engines, each write is checked by reading the file back with std::fs
//! (not through deepnvme) and each read against the bytes written. (The
//! huge pages themselves are checked in src/pinned/page_buffer.rs.)

use crate::common::*;
use deepnvme::{FileTarget, LockedBuffer};

const MIB: usize = 1 << 20;
/// One huge page (the module shares its process: it locks little).
const LOCKED_LEN: usize = 2 * MIB;
/// More than two bounce windows (4 MiB each): a blocking op on a plain
/// buffer this large streams through huge-page windows.
const PLAIN_LEN: usize = 9 * MIB + 4096;

#[test]
fn locked_and_bounced_transfers_on_huge_pages_move_every_byte() {
    let dir = TempDir::new("huge-pages");
    for engine in engines() {
        let name = format!("{engine:?}");
        let path = dir.file(&format!("{name}.bin"));
        let h = handle_with(engine, MIB, 8, false, true, 2);
        let target = || FileTarget::Path(&path);

        let mut locked = LockedBuffer::new(LOCKED_LEN).unwrap();
        let pmd = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").unwrap_or_default();
        if pmd.trim() == (2 * MIB).to_string() {
            assert_eq!(locked.as_ptr() as usize % (2 * MIB), 0, "{name}: a locked buffer of 2 MiB starts on a huge page");
        }
        let data = pattern(11, LOCKED_LEN);
        locked.copy_from_slice(&data);
        h.write_from(&locked, target(), 4096).unwrap_or_else(|e| panic!("{name}: locked write: {e}"));
        let file = read_file(&path);
        assert_bytes_eq(&file[4096..4096 + LOCKED_LEN], &data, &format!("{name}: the file after a locked write"));
        locked.fill(0xEE);
        h.read_into(&mut locked, target(), 4096).unwrap_or_else(|e| panic!("{name}: locked read: {e}"));
        assert_bytes_eq(&locked, &data, &format!("{name}: a locked read"));
        drop(locked);

        let plain_data = pattern(12, PLAIN_LEN);
        h.write_from(&plain_data, target(), 0).unwrap_or_else(|e| panic!("{name}: plain write: {e}"));
        assert_bytes_eq(&read_file(&path)[..PLAIN_LEN], &plain_data, &format!("{name}: the file after a plain write"));
        let mut plain = vec![0xEEu8; PLAIN_LEN];
        h.read_into(&mut plain, target(), 0).unwrap_or_else(|e| panic!("{name}: plain read: {e}"));
        assert_bytes_eq(&plain, &plain_data, &format!("{name}: a plain (bounced) read"));
    }
}
