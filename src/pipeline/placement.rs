//! Where new replicas go: among the datanodes that may take one (live, in
//! service, with room), a random choice weighted by free space, so that
//! emptier datanodes fill faster while concurrent writers, which all see
//! the same free space, still spread their blocks instead of all picking
//! the single emptiest one (HDFS's available-space placement makes the
//! same trade). The rules are in docs/SEMANTICS.md, "Replication and
//! faults".

use crate::meta::DnId;

/// A datanode that may take the replica, and its free bytes as of its
/// last heartbeat.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub id: DnId,
    pub free: u64,
}

/// Picks up to `n` distinct candidates, each draw weighted by free bytes
/// among those left. `draw(k)` returns a number in `0..k` (the caller's
/// random source, so tests can fix it).
pub fn pick(mut cands: Vec<Candidate>, n: usize, mut draw: impl FnMut(u128) -> u128) -> Vec<DnId> {
    let mut out = Vec::with_capacity(n.min(cands.len()));
    while out.len() < n && !cands.is_empty() {
        // Every candidate weighs at least 1, so that datanodes whose free
        // space is unknown or tiny can still be drawn.
        let total: u128 = cands.iter().map(|c| u128::from(c.free.max(1))).sum();
        let mut at = draw(total);
        let mut k = cands.len() - 1;
        for (i, c) in cands.iter().enumerate() {
            let w = u128::from(c.free.max(1));
            if at < w {
                k = i;
                break;
            }
            at -= w;
        }
        out.push(cands.swap_remove(k).id);
    }
    out
}

/// [`pick`] with the process's random source.
pub fn pick_random(cands: Vec<Candidate>, n: usize) -> Vec<DnId> {
    pick(cands, n, |k| {
        let r = (u128::from(fastrand::u64(..)) << 64) | u128::from(fastrand::u64(..));
        r % k
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: u32, free: u64) -> Candidate {
        Candidate { id: DnId(id), free }
    }

    #[test]
    fn draws_are_weighted_by_free_space_and_distinct() {
        // A draw at the very start takes the first; one at the very end
        // the last; in between by cumulative weight.
        let cands = vec![c(0, 10), c(1, 30), c(2, 60)];
        assert_eq!(pick(cands.clone(), 1, |_| 0), vec![DnId(0)]);
        assert_eq!(pick(cands.clone(), 1, |_| 10), vec![DnId(1)]);
        assert_eq!(pick(cands.clone(), 1, |k| k - 1), vec![DnId(2)]);
        let all = pick(cands.clone(), 5, |k| k / 2);
        let mut sorted = all.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!((all.len(), sorted.len()), (3, 3), "{all:?}");
    }

    #[test]
    fn emptier_datanodes_are_chosen_more_often_but_not_always() {
        let cands = vec![c(0, 1 << 30), c(1, 4 << 30)];
        let mut firsts = [0u32; 2];
        for _ in 0..2000 {
            firsts[pick_random(cands.clone(), 1)[0].0 as usize] += 1;
        }
        // Expected 400 : 1600.
        assert!(firsts[0] > 250 && firsts[0] < 550, "{firsts:?}");
        // Equal free space (datanodes sharing a disk): an even spread.
        let even = vec![c(0, 7), c(1, 7), c(2, 7)];
        let mut seen = [0u32; 3];
        for _ in 0..3000 {
            seen[pick_random(even.clone(), 1)[0].0 as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }
}
