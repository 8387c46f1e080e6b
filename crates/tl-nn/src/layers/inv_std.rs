//! BatchNorm's eval scale `1/sqrt(running_var + ε)` as an op of the pass: [`op`], a user op
//! ([`tl_ir::UserOp`]) whose value is [`running_inv_std`] in f64 rounded once to the scalar
//! type, with a device implementation (`Device::running_inv_std`, one launch of
//! `tl_running_inv_std`), so an eval pass on a CUDA backend reads the running variance from its
//! resident mirror: nothing downloaded, nothing uploaded, the bits of the host's rule.

use tl_ir::{Param as OpParam, UserOp, UserOpRef};
use tl_spec::ops::norm::running_inv_std;
use tl_spec::{Result, Scalar, Shape, Tensor};
use tl_tape_cuda::user::{DeviceImpl, with_device};

/// `1/sqrt(v + ε)` per element of a running variance (not differentiable: a buffer's scale).
struct RunningInvStd {
    eps: f64,
}

impl UserOp for RunningInvStd {
    fn name(&self) -> &'static str {
        "batchnormRunningInvStd"
    }
    fn params(&self) -> Vec<(&'static str, OpParam)> {
        vec![("eps", OpParam::Float(self.eps))]
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, shapes: &[&Shape]) -> Result<Shape> {
        Ok(shapes[0].clone())
    }
    fn is_differentiable(&self) -> bool {
        false
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
        x[0].try_map(self.name(), |v| {
            T::lit(running_inv_std(v.as_f64(), self.eps))
        })
    }
    fn vjp<T: Scalar>(&self, x: &[&Tensor<T>], _: &Tensor<T>) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![None; x.len()])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], _: &[&Tensor<T>]) -> Result<Tensor<T>> {
        Tensor::try_zeros(self.name(), x[0].shape().clone())
    }
}

/// The op `1/sqrt(running_var + eps)` with its device implementation attached.
pub(crate) fn op(eps: f64) -> UserOpRef {
    let imp = DeviceImpl::new(
        move |dev, x, _| dev.running_inv_std(x[0].buffer(), eps),
        |_, x, _, _, _| Ok(vec![None; x.len()]),
    );
    with_device(UserOpRef::new(RunningInvStd { eps }), imp)
}

#[cfg(test)]
mod tests {
    use tl_conformance::user::{UserEntry, check_user_op};
    use tl_conformance::{Domain, RunConfig};

    /// The op through the harness a user's op goes through: its f64 rule rounded once on the
    /// CPU tape, the sim's `running_inv_std` (and, with `cuda-emu`, the emulated
    /// `tl_running_inv_std` kernel) within an ulp of it, both sessions; nothing differentiable
    /// (its VJP and JVP are zero).
    #[test]
    fn the_eval_scale_passes_the_user_op_checks() {
        for eps in [1e-5, 0.5] {
            let entry = UserEntry::elementwise(super::op(eps))
                .domains(Domain::Positive(1e-3, 4.0))
                .ulps(1)
                .no_fd("not differentiable: a buffer's scale, its VJP is zero");
            let cfg = RunConfig {
                cases: 16,
                ..RunConfig::default()
            };
            let report = check_user_op(&entry, &cfg);
            assert!(report.passed(), "eps {eps}:\n{report}");
            // The emulated `tl_running_inv_std` is among the rows when the build has it.
            let emulated = report.reports.iter().any(|r| r.label.contains("cuda-emu"));
            assert_eq!(emulated, cfg!(feature = "cuda-emu"), "{report}");
        }
    }
}
