//! How one GDS transfer is cut among its threads: [`plan_pieces`] splits
//! the bytes into up to `parallelism` [`DevicePiece`]s of at least a block
//! each, with inner boundaries on [`PIECE_ALIGN`].

/// Piece boundaries inside a transfer fall on multiples of this, so that a
/// transfer that starts aligned keeps every piece aligned for O_DIRECT.
pub(crate) const PIECE_ALIGN: usize = 4096;

/// One piece of a transfer: bytes `[offset, offset + len)` of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DevicePiece {
    pub offset: usize,
    pub len: usize,
}

/// Cuts `len` bytes into at most `parallelism` pieces, none smaller than
/// `block_size` unless the whole is (so small transfers stay on one thread),
/// with inner boundaries on [`PIECE_ALIGN`]. The pieces cover `[0, len)`
/// exactly, in order, and none is empty.
pub(crate) fn plan_pieces(len: usize, parallelism: usize, block_size: usize) -> Vec<DevicePiece> {
    if len == 0 {
        return Vec::new();
    }
    let block_size = block_size.max(1);
    // Inner pieces are `chunk` bytes: the even share rounded DOWN to the
    // alignment, so the last piece (the remainder) is never the short one.
    // Fewer pieces when a share would fall under a block.
    let chunk_for = |n: usize| len / n / PIECE_ALIGN * PIECE_ALIGN;
    let mut n = parallelism.max(1).min(len / block_size).max(1);
    while n > 1 && chunk_for(n) < block_size.max(1) {
        n -= 1;
    }
    let chunk = if n == 1 { len } else { chunk_for(n) };
    let mut pieces = Vec::with_capacity(n);
    for i in 0..n {
        let offset = i * chunk;
        let l = if i + 1 == n { len - offset } else { chunk };
        pieces.push(DevicePiece { offset, len: l });
    }
    pieces
}

#[cfg(test)]
mod tests {
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

}

#[cfg(test)]
#[path = "pieces_proptests.rs"]
mod proptests;
