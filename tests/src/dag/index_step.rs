//! DAG menu entries 40–47 (the Index family, concat/slice, gelu/silu/geluErf, cross-entropy), split
//! from `dag.rs` to keep it short.

use tl_ir::Op;
use tl_spec::{Shape, Tensor};

use super::Dag;
use tl_ir::Id;

impl Dag {
    /// Menu entries 40–47: gelu/silu/geluErf, concat/slice, gathers (static, raw, Nat environment,
    /// index tensor), scatter-adds and cross-entropy. Runtime indices include out-of-range and
    /// repeated values; Nat-environment steps append theirs to `self.nats`.
    pub(super) fn index_step(&mut self, kind: u8, x: Id, y: Id, p: u16) {
        let p = usize::from(p);
        let lift = |d: &mut Self, x: Id| {
            if d.shape(x).rank() == 0 {
                d.as_rank(x, 1)
            } else {
                x
            }
        };
        match kind {
            40 => {
                let a = self.add([Op::Gelu, Op::Silu, Op::GeluErf][p / 4 % 3].clone(), &[x]);
                // Half the time a gated form `x · act(x)` (fan-out through the activation).
                if p % 4 < 2 {
                    self.add(Op::Mul, &[x, a]);
                }
            }
            41 => {
                let x = lift(self, x);
                let mut to = self.shape(x).dims().to_vec();
                to[0] = 1 + p % 3;
                // Half the time x joins itself (fan-out: its cotangent gets two parts).
                let y = if p % 4 < 2 {
                    x
                } else {
                    self.adapt(y, &Shape::from(to))
                };
                let (a, b) = if p % 2 == 0 { (x, y) } else { (y, x) };
                self.add(Op::Concat, &[a, b]);
            }
            42 => {
                let x = lift(self, x);
                let n = self.shape(x).dims()[0];
                let start = p % n;
                let len = 1 + (p / n) % (n - start);
                let a = self.add(Op::Slice { start, len }, &[x]);
                // A second, overlapping slice of x joined to the first (fan-out into x).
                let b = self.add(Op::Slice { start: 0, len: 1 }, &[x]);
                self.add(Op::Concat, &[a, b]);
            }
            43..=45 => {
                let x = self.as_rank(x, 1 + p % 2);
                let rows = self.shape(x).dims()[0];
                let row = self.shape(x).rank() == 2;
                let k = 1 + (p / 2) % 4;
                // Indices in 0..rows + 2 (some out of range), the third repeating the first.
                let mut idx: Vec<usize> = (0..k).map(|j| (p / 8 + 5 * j) % (rows + 2)).collect();
                if k >= 3 {
                    idx[2] = idx[0];
                }
                let op = match (kind, row, p / 16 % 2) {
                    (43, false, 0) => Op::GatherScalar {
                        index: idx[0] % rows,
                    },
                    (43, true, 0) => Op::GatherRow {
                        index: idx[0] % rows,
                    },
                    (43, false, _) => Op::GatherScalarRaw { index: idx[0] },
                    (43, true, _) => Op::GatherRowRaw { index: idx[0] },
                    (45, ..) => {
                        // An index tensor (a constant: indices are never differentiated), with
                        // a negative and a fractional entry when long enough.
                        let mut v: Vec<f64> = idx.iter().map(|&i| i as f64).collect();
                        if k == 4 {
                            v[1] = -1.0;
                            v[3] = 0.5;
                        }
                        let c = self.add(Op::Constant(Tensor::vector(v)), &[]);
                        self.add(Op::GatherIndexTensor, &[x, c]);
                        return;
                    }
                    (_, row, single) => {
                        let at = self.nats.len();
                        let single = single == 0;
                        self.nats.extend(if single { &idx[..1] } else { &idx[..] });
                        match (row, single) {
                            (false, true) => Op::GatherScalarNat { at },
                            (true, true) => Op::GatherRowNat { at },
                            (false, false) => Op::GatherScalarsNatVec { at, k },
                            (true, false) => Op::GatherRowsNatVec { at, k },
                        }
                    }
                };
                self.add(op, &[x]);
            }
            46 => {
                let x = self.as_rank(x, 1 + p % 2);
                let s = self.shape(x);
                // v from x itself half the time (fan-out), else from another id.
                let src = if p % 4 < 2 { x } else { y };
                let v = self.adapt(src, &Shape::new(&s.dims()[1..]));
                let index = p / 2 % s.dims()[0];
                let op = if s.rank() == 1 {
                    Op::ScatterAddVec { index }
                } else {
                    Op::ScatterAddRow { index }
                };
                self.add(op, &[x, v]);
            }
            _ => {
                let x = if self.shape(x).rank() >= 2 {
                    self.as_rank(x, 2)
                } else {
                    self.as_rank(x, 1)
                };
                let (rows, classes) = self.shape(x).rows_cols();
                let labels_at = self.nats.len();
                // Labels in 0..=classes: `classes` itself is out of range (that row gives 0).
                self.nats
                    .extend((0..rows).map(|r| (p + 3 * r) % (classes + 1)));
                self.add(Op::CrossEntropy { labels_at }, &[x]);
            }
        }
    }
}
