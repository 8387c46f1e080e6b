//! The bias epilogue: `x + b` with `b` (ch) broadcast over `x` (outer, ch, inner), optionally
//! followed by an activation — the pointwise chain that ends `linear` and `conv` (broadcast,
//! add) and, in a compiled graph, the activation after them — as one kernel
//! ([`Device::add_bias`], [`Device::add_bias_act`]).
//!
//! The chain's arithmetic is unchanged: the sum is the f32 `x + b` that `add` of the broadcast
//! bias computes, and the activation is the same function as the standalone kernel's
//! (`relu`, `gelu`), applied to the rounded sum. So the fused launch gives the unfused launches'
//! bits on every device (tests: `tests/tl_tape_cuda/device.rs`, and the kernel emulator's
//! comparison in `gpu.rs`).
//!
//! [`Device::add_bias`]: super::Device::add_bias
//! [`Device::add_bias_act`]: super::Device::add_bias_act

use super::{Buffer, check};
use crate::{Result, abi};

/// An activation the bias epilogue can apply (the kernel receives [`Act::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// `max(v, 0)` ([`Device::relu`](super::Device::relu)).
    Relu,
    /// The tanh-form gelu ([`Device::gelu`](super::Device::gelu)).
    Gelu,
}

impl Act {
    /// The activation a unary op applies, if the epilogue has it.
    pub fn of(op: &tl_ir::Op) -> Option<Act> {
        match op {
            tl_ir::Op::Relu => Some(Act::Relu),
            tl_ir::Op::Gelu => Some(Act::Gelu),
            _ => None,
        }
    }

    /// The kernel's code: 0 is no activation (one output), then one per variant.
    pub fn code(act: Option<Act>) -> u32 {
        match act {
            None => 0,
            Some(Act::Relu) => 1,
            Some(Act::Gelu) => 2,
        }
    }
}

/// The checked layout of a bias epilogue: `x` is (outer, ch, inner), the bias (ch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BiasLayout {
    /// Leading extent (batch rows, or batch entries of a conv).
    pub outer: usize,
    /// Channels: the bias's length.
    pub ch: usize,
    /// Trailing extent each bias element covers (1 for `linear`, the spatial size for `conv`).
    pub inner: usize,
}

impl BiasLayout {
    /// The layout (outer, ch, inner).
    pub fn new(outer: usize, ch: usize, inner: usize) -> BiasLayout {
        BiasLayout { outer, ch, inner }
    }

    /// Check `x` and `b` against the layout (`op` names the primitive in errors); returns the
    /// output's length.
    pub fn check(&self, op: &'static str, x: Buffer, b: Buffer) -> Result<usize> {
        let n = check::product(op, &[self.outer, self.ch, self.inner])?;
        abi::len_u32(op, n)?;
        abi::to_u32(op, "channels", self.ch)?;
        abi::to_u32(op, "inner", self.inner)?;
        check::len_is(op, "input", x, n)?;
        check::len_is(op, "bias", b, self.ch)?;
        Ok(n)
    }

    /// The bias index of output element `i`.
    pub fn channel(&self, i: usize) -> usize {
        (i / self.inner.max(1)) % self.ch.max(1)
    }
}
