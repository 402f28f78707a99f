//! Tests of [`plan_pieces`]: how one GDS transfer is cut among its worker
//! threads; examples first, then properties.

use proptest::prelude::*;

use super::*;

fn check_cover(len: usize, p: usize, bs: usize) -> Vec<DevicePiece> {
    let pieces = plan_pieces(len, p, bs);
    let mut at = 0;
    for (i, piece) in pieces.iter().enumerate() {
        assert_eq!(piece.offset, at, "contiguous");
        assert!(piece.len > 0, "no empty piece");
        if i + 1 < pieces.len() {
            assert_eq!((piece.offset + piece.len) % PIECE_ALIGN, 0, "inner boundary aligned");
        }
        at += piece.len;
    }
    assert_eq!(at, len, "covers exactly");
    assert!(pieces.len() <= p.max(1));
    pieces
}

#[test]
fn pieces_cover_the_transfer_aligned_and_bounded() {
    assert!(plan_pieces(0, 4, 1 << 20).is_empty());
    assert_eq!(check_cover(1000, 8, 1 << 20).len(), 1, "small: one piece, one thread");
    assert_eq!(check_cover(4 << 20, 4, 1 << 20).len(), 4);
    assert_eq!(check_cover(4 << 20, 8, 1 << 20).len(), 4, "never below one block per piece");
    assert_eq!(check_cover(4 << 20, 1, 1 << 20).len(), 1);
    for (len, p, bs) in [(10_000_000, 3, 4096), (123_457, 5, 1), (4096 * 7 + 1, 7, 4096), (1 << 30, 16, 1 << 20)] {
        check_cover(len, p, bs);
    }
    assert_eq!(
        check_cover(5 << 20, 4, 1 << 20),
        vec![
            DevicePiece { offset: 0, len: 1310720 },
            DevicePiece { offset: 1310720, len: 1310720 },
            DevicePiece { offset: 2621440, len: 1310720 },
            DevicePiece { offset: 3932160, len: 1310720 },
        ]
    );
}

/// Lengths up to 1 GiB, biased to the edges the planner rounds at.
fn lens() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        4 => 0usize..(1 << 30),
        4 => 0usize..(64 << 10),
        4 => (0usize..(1 << 18), -2isize..=2).prop_map(|(k, d)| (k * PIECE_ALIGN).saturating_add_signed(d)),
        4 => (0usize..1024, -2isize..=2).prop_map(|(k, d)| (k << 20).saturating_add_signed(d)),
    ]
}

fn block_sizes() -> impl Strategy<Value = usize> {
    prop_oneof![
        1usize..(4 << 20),
        prop::sample::select(vec![1usize, 512, 4096, 65536, 1 << 20, 8 << 20]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// The pieces tile [0, len) in order: no gap, no overlap, none empty;
    /// inner boundaries fall on PIECE_ALIGN; there are at most
    /// `parallelism` of them and never more than there are blocks.
    #[test]
    fn pieces_tile_the_transfer(len in lens(), parallelism in 0usize..=64, block_size in block_sizes()) {
        let pieces = plan_pieces(len, parallelism, block_size);
        let mut at = 0;
        for (i, p) in pieces.iter().enumerate() {
            prop_assert!(p.len > 0, "piece {} is empty", i);
            prop_assert_eq!(p.offset, at, "gap or overlap before piece {}", i);
            at = p.offset + p.len;
            if i + 1 < pieces.len() {
                prop_assert_eq!(at % PIECE_ALIGN, 0, "inner boundary {} not on {}", at, PIECE_ALIGN);
            }
        }
        prop_assert_eq!(at, len, "the pieces cover {} of {} bytes", at, len);
        prop_assert!(pieces.len() <= parallelism.max(1), "{} pieces for parallelism {}", pieces.len(), parallelism);
        prop_assert!(pieces.len() <= len.div_ceil(block_size), "{} pieces for {} blocks", pieces.len(), len.div_ceil(block_size));
        prop_assert_eq!(pieces.is_empty(), len == 0);
    }

    /// The documented contract: no piece is smaller than `block_size`
    /// unless the whole transfer is (then it is one piece).
    /// (It found that the planner once cut 4 MiB + 4 KiB at parallelism 8
    /// with 1 MiB blocks into five 820 KiB pieces.)
    #[test]
    fn no_piece_is_smaller_than_a_block(len in lens(), parallelism in 0usize..=64, block_size in block_sizes()) {
        let pieces = plan_pieces(len, parallelism, block_size);
        if len < block_size {
            prop_assert!(pieces.len() <= 1, "{} bytes, less than a block, cut into {} pieces", len, pieces.len());
        } else {
            for p in &pieces {
                prop_assert!(p.len >= block_size, "piece {:?} is smaller than the {}-byte block ({} bytes, parallelism {})",
                             p, block_size, len, parallelism);
            }
        }
    }
}
