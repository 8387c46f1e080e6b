//! `Recorder`: what a tape must offer to be compiled into, and `GraphData::replay` ("compile").

use smallvec::SmallVec;
use tl_spec::{Scalar, Tensor};

use crate::{GraphData, Id, Op};

/// An operand of the op a recorder applies right after another ([`Recorder::apply_then`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// The result of the op applied just before.
    First,
    /// An id the recorder gave earlier.
    Id(usize),
}

impl Then {
    /// `args` as recorder ids, `first` being the first op's id.
    pub fn resolve(args: &[Then], first: usize) -> SmallVec<[usize; 3]> {
        args.iter()
            .map(|a| match *a {
                Then::First => first,
                Then::Id(id) => id,
            })
            .collect()
    }
}

/// Anything that can record leaves and op applications: the CPU tape, the CUDA tape, and the
/// eager sessions built on them. Eager execution and compiled replay share this one interface.
pub trait Recorder<T: Scalar> {
    /// The recorder's error type; IR errors (bad leaf values) must convert into it.
    type Error: From<crate::Error>;

    /// Record a leaf holding `value`; returns its id on the recorder.
    fn leaf(
        &mut self,
        value: Tensor<T>,
        name: Option<&str>,
        requires_grad: bool,
    ) -> Result<usize, Self::Error>;

    /// Record `op` applied to the recorder ids `args`; returns the new id.
    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize, Self::Error>;

    /// Replace the Nat environment (runtime indices and labels) that later ops read.
    fn set_nats(&mut self, nats: &[usize]) -> Result<(), Self::Error>;

    /// Let go of the value of recorder id `id` if no backward can read it (it does not require
    /// grad and nothing that requires grad reads it); returns whether it did. A compiled
    /// replay calls it for a node no handle refers to once its last reader has run
    /// ([`GraphData::replay_more_releasing`]). The default keeps every value.
    fn release(&mut self, id: usize) -> Result<bool, Self::Error> {
        let _ = id;
        Ok(false)
    }

    /// Whether the recorder runs `op` then `next` (reading `next_args`, among them `op`'s result,
    /// [`Then::First`]) as one step in [`apply_then`](Self::apply_then). [`GraphData::replay`]
    /// offers a pair only where this says so, so that a pair it cannot fuse does not take a
    /// node that the pair after it could use. The default: no pair.
    fn fuses(&self, op: &Op, next: &Op, next_args: &[Then]) -> bool {
        let _ = (op, next, next_args);
        false
    }

    /// Record `op` applied to `args`, then `next` applied to `next_args` (among them the
    /// first op's result, [`Then::First`]); returns both ids. A recorder that can run a pair as
    /// one step overrides this and [`fuses`](Self::fuses) (the CUDA tape fuses a bias epilogue
    /// with the activation after it, or with a residual add: one launch for `linear` + `relu`);
    /// the values must be the ones the two [`apply`](Self::apply) calls give, which is this
    /// default. [`GraphData::replay`] calls it for each pair `fuses` accepts.
    fn apply_then(
        &mut self,
        op: &Op,
        args: &[usize],
        next: &Op,
        next_args: &[Then],
    ) -> Result<(usize, usize), Self::Error> {
        let first = self.apply(op, args)?;
        let second = self.apply(next, &Then::resolve(next_args, first))?;
        Ok((first, second))
    }
}

impl GraphData {
    /// Replay the graph into `rec` ("compile"): sets the Nat environment, records every leaf
    /// with its value, then every node. Returns, for each graph id, the id it received on the
    /// recorder.
    pub fn replay<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        leaves: &[Tensor<T>],
        nats: &[usize],
    ) -> Result<Vec<usize>, R::Error> {
        let map = self.replay_leaves(rec, leaves, nats)?;
        self.replay_nodes(rec, map)
    }

    /// The first half of [`replay`](Self::replay): set the Nat environment and record every
    /// leaf with its value; returns the leaves' recorder ids, for
    /// [`replay_more`](Self::replay_more) or
    /// [`replay_more_releasing`](Self::replay_more_releasing) to record the nodes.
    pub fn replay_leaves<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        leaves: &[Tensor<T>],
        nats: &[usize],
    ) -> Result<Vec<usize>, R::Error> {
        self.check_leaf_values("replay", leaves)?;
        rec.set_nats(nats)?;
        let mut map: Vec<Id> = Vec::with_capacity(self.len());
        for (leaf, value) in self.leaves().iter().zip(leaves) {
            map.push(rec.leaf(value.clone(), leaf.name.as_deref(), leaf.requires_grad)?);
        }
        Ok(map)
    }

    /// The second half of [`replay`](Self::replay): record every node onto `rec`, whose
    /// leaves the caller has recorded already (`leaf_ids[i]` is leaf `i`'s recorder id; e.g. a
    /// parameter kept resident on a device instead of uploaded from a host value). The Nat
    /// environment must be set. Returns, for each graph id, its recorder id.
    pub fn replay_nodes<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        leaf_ids: Vec<usize>,
    ) -> Result<Vec<usize>, R::Error> {
        if leaf_ids.len() != self.leaves().len() {
            return Err(crate::Error::Count {
                what: "replay_nodes: leaf ids",
                expected: self.leaves().len(),
                got: leaf_ids.len(),
            }
            .into());
        }
        let mut map: Vec<Id> = leaf_ids;
        self.replay_more(rec, &mut map)?;
        Ok(map)
    }

    /// Continue a replay onto `rec`: `map` holds the recorder ids of the leaves and of the
    /// first `map.len() − leaves` nodes (from an earlier [`replay`](Self::replay),
    /// [`replay_nodes`](Self::replay_nodes) or call of this), and gets those of the nodes
    /// recorded since. A graph that only grew between the calls gets the values a whole replay
    /// would give (a pair split across two calls is recorded one op at a time, which
    /// [`Recorder::apply_then`] must equal). A `map` longer than the graph is an error.
    pub fn replay_more<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        map: &mut Vec<usize>,
    ) -> Result<(), R::Error> {
        self.replay_from(rec, map, None)
    }

    /// [`replay_more`](Self::replay_more) that lets go of the values nothing will read: a node
    /// (never a leaf) for which `dead(graph id)` says no handle refers to it any more is
    /// offered to [`Recorder::release`] as soon as its last reader in the graph has run (right
    /// after it runs, when nothing reads it). `dropped` lists the nodes whose last handle went
    /// since the previous call: those whose readers all ran are offered first. The recorder
    /// keeps what a backward may read. What is released is what an eager session frees when
    /// the last handle to a node is dropped; every value kept is the one
    /// [`replay_more`](Self::replay_more) gives. The work is proportional to the nodes
    /// recorded and the ids dropped, not to the graph.
    pub fn replay_more_releasing<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        map: &mut Vec<usize>,
        dead: &dyn Fn(Id) -> bool,
        dropped: &[Id],
    ) -> Result<(), R::Error> {
        let live = Liveness { graph: self, dead };
        let replayed = map.len();
        for &id in dropped {
            // A node of an earlier call (or of none yet: one past `replayed` waits for its turn).
            if id < replayed {
                live.release_if_done(rec, map, id, replayed)?;
            }
        }
        self.replay_from(rec, map, Some(&live))
    }

    /// The loop of [`replay_more`](Self::replay_more), releasing as
    /// [`replay_more_releasing`](Self::replay_more_releasing) says when `dead` is given.
    fn replay_from<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        map: &mut Vec<usize>,
        live: Option<&Liveness>,
    ) -> Result<(), R::Error> {
        let nodes = self.nodes();
        let Some(mut k) = map
            .len()
            .checked_sub(self.leaves().len())
            .filter(|&k| k <= nodes.len())
        else {
            return Err(crate::Error::Count {
                what: "replay_more: recorder ids",
                expected: self.len(),
                got: map.len(),
            }
            .into());
        };
        map.reserve(nodes.len() - k);
        let leaves = self.leaves().len();
        let mut args = Vec::with_capacity(3);
        let mut then: SmallVec<[Then; 3]> = SmallVec::new();
        while k < nodes.len() {
            let node = &nodes[k];
            args.clear();
            args.extend(node.args().iter().map(|&a| map[a]));
            // The graph id node k receives is `map.len()`; a next node reading it is a pair
            // the recorder may fuse.
            let prev = map.len();
            then.clear();
            if let Some(next) = nodes.get(k + 1).filter(|n| n.args().contains(&prev)) {
                then.extend(next.args().iter().map(|&a| {
                    if a == prev {
                        Then::First
                    } else {
                        Then::Id(map[a])
                    }
                }));
            }
            let from = k;
            match nodes.get(k + 1) {
                Some(next) if !then.is_empty() && rec.fuses(node.op(), next.op(), &then) => {
                    let (a, b) = rec.apply_then(node.op(), &args, next.op(), &then)?;
                    map.push(a);
                    map.push(b);
                    k += 2;
                }
                _ => {
                    map.push(rec.apply(node.op(), &args)?);
                    k += 1;
                }
            }
            if let Some(live) = live {
                for id in self.reads_ending(from, k) {
                    live.release_if_done(rec, map, id, leaves + k)?;
                }
            }
        }
        Ok(())
    }
}

/// What [`GraphData::replay_more_releasing`] knows of each graph id: whether a handle still
/// refers to it ([`Liveness::dead`]) and its last reader ([`GraphData::read_until`]).
struct Liveness<'a> {
    graph: &'a GraphData,
    dead: &'a dyn Fn(Id) -> bool,
}

impl Liveness<'_> {
    /// Offer graph id `id` to the recorder's release when it is a node no handle refers to and
    /// every reader of it is below `replayed` (the graph ids replayed so far).
    fn release_if_done<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        map: &[usize],
        id: Id,
        replayed: Id,
    ) -> Result<(), R::Error> {
        let g = self.graph;
        if id >= g.leaves().len() && g.read_until(id) <= replayed && (self.dead)(id) {
            rec.release(map[id])?;
        }
        Ok(())
    }
}
