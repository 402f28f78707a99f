//! Where a striped file's bytes are: logical bytes are cut into stripe
//! units dealt round-robin to the members, so unit `s` of the file is unit
//! `s / N` of member `s % N`. Pure arithmetic, no I/O.
//!
//! Because the unit is a whole number of pages (and of every member's
//! O_DIRECT alignment), a logical offset and its member offset have the
//! same alignment, and each logical page is exactly one member page: the
//! op planner's page rules (`op/plan.rs`) hold on every member.

/// A stripe set's geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per stripe unit (a multiple of the page size).
    pub unit: u64,
    /// How many members.
    pub members: usize,
}

/// A run of logical bytes that lies in one member, contiguously.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemberRun {
    pub member: usize,
    pub member_offset: u64,
    pub logical: u64,
    pub len: u64,
}

impl Layout {
    fn row(&self) -> u64 {
        self.unit * self.members as u64
    }

    /// The member and the offset in it of logical byte `logical`.
    pub fn locate(&self, logical: u64) -> (usize, u64) {
        let stripe = logical / self.unit;
        let member = (stripe % self.members as u64) as usize;
        let member_offset = (stripe / self.members as u64) * self.unit + logical % self.unit;
        (member, member_offset)
    }

    /// The logical offset of byte `member_offset` of member `member`.
    pub fn logical_of(&self, member: usize, member_offset: u64) -> u64 {
        ((member_offset / self.unit) * self.members as u64 + member as u64) * self.unit + member_offset % self.unit
    }

    /// How many bytes member `member` holds of a file whose first `extent`
    /// logical bytes are striped: the size its file must at least have.
    pub fn member_size(&self, member: usize, extent: u64) -> u64 {
        let rows = extent / self.row();
        let rest = extent % self.row();
        let before = member as u64 * self.unit;
        rows * self.unit + rest.saturating_sub(before).min(self.unit)
    }

    /// The runs that make up logical bytes `[start, end)`, in logical order.
    pub(crate) fn runs(&self, start: u64, end: u64) -> impl Iterator<Item = MemberRun> + '_ {
        let mut at = start;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let (member, member_offset) = self.locate(at);
            let unit_end = (at / self.unit + 1) * self.unit;
            let len = unit_end.min(end) - at;
            let run = MemberRun { member, member_offset, logical: at, len };
            at += len;
            Some(run)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn two_members_of_one_mib() {
        let l = Layout { unit: 1 << 20, members: 2 };
        assert_eq!(l.locate(0), (0, 0));
        assert_eq!(l.locate((1 << 20) + 5), (1, 5));
        assert_eq!(l.locate((2 << 20) + 7), (0, (1 << 20) + 7));
        assert_eq!(l.member_size(0, 0), 0);
        assert_eq!(l.member_size(0, 100), 100);
        assert_eq!(l.member_size(1, 100), 0);
        assert_eq!(l.member_size(1, (1 << 20) + 1), 1);
        assert_eq!(l.member_size(0, (3 << 20) + 1), 2 << 20);
        assert_eq!(l.member_size(1, (3 << 20) + 1), (1 << 20) + 1);
    }

    proptest! {
        #[test]
        fn runs_cover_the_range_and_invert(
            unit_pages in 1u64..8, members in 1usize..6, start in 0u64..200_000, len in 0u64..300_000,
        ) {
            let l = Layout { unit: unit_pages * 4096, members };
            let mut at = start;
            for r in l.runs(start, start + len) {
                prop_assert_eq!(r.logical, at);
                prop_assert!(r.len > 0);
                // A run never crosses a unit boundary, and every byte maps back.
                prop_assert_eq!(r.member_offset / l.unit, (r.member_offset + r.len - 1) / l.unit);
                prop_assert_eq!(l.logical_of(r.member, r.member_offset), r.logical);
                prop_assert_eq!(l.locate(r.logical + r.len - 1), (r.member, r.member_offset + r.len - 1));
                prop_assert_eq!(r.member_offset % 4096, r.logical % 4096);
                at += r.len;
            }
            prop_assert_eq!(at, start + len);
        }

        #[test]
        fn member_sizes_add_up_and_cover_every_byte(unit_pages in 1u64..4, members in 1usize..5, extent in 0u64..100_000) {
            let l = Layout { unit: unit_pages * 4096, members };
            let total: u64 = (0..members).map(|m| l.member_size(m, extent)).sum();
            prop_assert_eq!(total, extent);
            if extent > 0 {
                let (m, off) = l.locate(extent - 1);
                prop_assert_eq!(l.member_size(m, extent), off + 1);
            }
        }
    }
}
