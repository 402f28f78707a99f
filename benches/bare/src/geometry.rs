//! How one op's bytes are split, as DeepSpeed's intra_op_parallelism splits
//! a tensor: `parallelism` contiguous slices (page-aligned inner
//! boundaries), each moved in blocks of `block_size` with up to
//! `queue_depth` of them in flight.

/// One worker's share of every op: bytes `start..start + len` of the buffer,
/// at the same distance from the op's file offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub start: usize,
    pub len: usize,
}

/// The slices of an op of `op_bytes` over `parallelism` workers. Inner
/// boundaries are on 4 KiB, so every block stays O_DIRECT-aligned; a slice
/// may be empty when the op is smaller than the workers' pages.
pub fn slices(op_bytes: usize, parallelism: usize) -> Vec<Slice> {
    let per = op_bytes.div_ceil(parallelism).next_multiple_of(4096);
    (0..parallelism)
        .map(|i| {
            let start = (i * per).min(op_bytes);
            let end = ((i + 1) * per).min(op_bytes);
            Slice { start, len: end - start }
        })
        .collect()
}

/// The blocks of a slice: (offset inside the slice, length).
pub fn blocks(len: usize, block_size: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len).step_by(block_size).map(move |o| (o, block_size.min(len - o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_op_once_in_order() {
        for (op, par) in [(128 << 20, 1), (128 << 20, 2), (128 << 20, 3), (8192, 4), (1 << 30, 2)] {
            let s = slices(op, par);
            assert_eq!(s.len(), par);
            let mut at = 0;
            for x in &s {
                assert_eq!(x.start, at, "{op} {par}: {s:?}");
                assert_eq!(x.start % 4096, 0);
                at += x.len;
            }
            assert_eq!(at, op, "{op} {par}: {s:?}");
        }
    }

    #[test]
    fn blocks_cover_a_slice_with_a_short_tail() {
        let b: Vec<_> = blocks(5 << 20, 2 << 20).collect();
        assert_eq!(b, vec![(0, 2 << 20), (2 << 20, 2 << 20), (4 << 20, 1 << 20)]);
        assert_eq!(blocks(0, 4096).count(), 0);
    }
}
