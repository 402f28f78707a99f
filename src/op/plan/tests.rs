//! Slice planning on fixed cases; `proptest` cases cover the general rule.

use super::*;
use crate::file::DioAlignment;

const DIO: DioAlignment = DioAlignment { offset: 512, memory: 512 };

fn covered(slices: &[SlicePlan]) -> Vec<(u64, usize)> {
    let mut v: Vec<_> = slices.iter().flat_map(|s| s.buffered.iter().chain(&s.direct)).map(|g| (g.file_offset, g.len)).collect();
    v.sort();
    v
}

#[test]
fn a_page_aligned_op_goes_direct_in_page_aligned_slices() {
    let page = page_size();
    let base = (16 * page) as *mut u8;
    let slices = plan_slices(0, base, 8 * page, 4, Some((3, DIO)), BUFFERED_FD_PLACEHOLDER);
    assert_eq!(slices.len(), 4);
    assert!(!needs_buffered(&slices));
    for (i, s) in slices.iter().enumerate() {
        assert_eq!(s.direct.len(), 1);
        assert_eq!(s.direct[0].file_offset, (i * 2 * page) as u64);
        assert_eq!(s.direct[0].fd, 3);
    }
}

#[test]
fn unaligned_edges_go_buffered_and_are_patched_to_the_opened_fd() {
    let page = page_size();
    let base = (16 * page + 100) as *mut u8;
    let mut slices = plan_slices(100, base, 3 * page, 1, Some((3, DIO)), BUFFERED_FD_PLACEHOLDER);
    assert!(needs_buffered(&slices));
    patch_buffered_fd(&mut slices, 9);
    let s = &slices[0];
    assert_eq!(s.buffered.iter().map(|g| (g.fd, g.file_offset, g.len)).collect::<Vec<_>>(),
               vec![(9, 100, page - 100), (9, 3 * page as u64, 100)]);
    assert_eq!((s.direct[0].file_offset, s.direct[0].len), (page as u64, 2 * page));
    assert_eq!(covered(&slices).iter().map(|c| c.1).sum::<usize>(), 3 * page);
}

#[test]
fn without_o_direct_everything_is_buffered() {
    let slices = plan_slices(7, 0x1000 as *mut u8, 10_000, 3, None, 5);
    assert!(slices.iter().all(|s| s.direct.is_empty()));
    assert_eq!(slices.iter().map(SlicePlan::bytes).sum::<usize>(), 10_000);
}
