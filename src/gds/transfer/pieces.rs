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
mod tests;
