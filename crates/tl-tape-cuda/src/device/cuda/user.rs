//! User kernels on the CUDA device ([`crate::user::KernelDevice`]): the kernel resolved in the
//! user's module by the driver (its PTX on a GPU, its emulator table under `cuda-emu`), fresh
//! outputs from the pool, one launch, the outputs released again on any error.

use super::CudaDevice;
use super::driver::{self, Arg};
use super::launch::blocks;
use crate::device::Buffer;
use crate::device::sim::reduce::BLOCK;
use crate::user::{KernelArg, KernelDevice, KernelModule, LaunchShape};
use crate::{Device, Error, Result};

impl KernelDevice for CudaDevice {
    fn launch_user(
        &mut self,
        op: &'static str,
        module: &KernelModule,
        kernel: &'static str,
        shape: LaunchShape,
        args: &[KernelArg],
        outs: &[usize],
    ) -> Result<Vec<Buffer>> {
        let named = |e: Error| {
            let m = module.name();
            let detail = if op == kernel {
                format!("module {m}: {e}")
            } else {
                format!("kernel {kernel} of module {m}: {e}")
            };
            Error::kernel(op, detail)
        };
        shape.check().map_err(|why| named(Error::kernel(op, why)))?;
        let launch = match shape {
            LaunchShape::GridStride(0) => None,
            LaunchShape::GridStride(n) => Some(([blocks(n), 1, 1], [BLOCK as u32, 1, 1], 0)),
            LaunchShape::Grid {
                grid,
                block,
                shared,
            } => Some((grid, block, shared)),
        };
        // The inputs first: a released buffer fails before anything is allocated.
        let mut raw = Vec::with_capacity(args.len());
        for a in args {
            // Err(k): the k-th output, known after allocation.
            raw.push(match *a {
                KernelArg::In(b) => Ok(Arg::Ptr(self.ptr(op, b).map_err(named)?)),
                KernelArg::Out(k) if k >= outs.len() => {
                    return Err(named(Error::kernel(
                        op,
                        format!(
                            "argument Out({k}) but the launch has {} output(s)",
                            outs.len()
                        ),
                    )));
                }
                KernelArg::Out(k) => Err(k),
                KernelArg::U64(v) => Ok(Arg::U64(v)),
                KernelArg::U32(v) => Ok(Arg::U32(v)),
                KernelArg::I32(v) => Ok(Arg::I32(v)),
                KernelArg::F32(v) => Ok(Arg::F32(v)),
                KernelArg::F64(v) => Ok(Arg::F64(v)),
            });
        }
        let f = driver::user_function(module, kernel).map_err(named)?;
        let mut bufs: Vec<Buffer> = Vec::with_capacity(outs.len());
        let mut ptrs = Vec::with_capacity(outs.len());
        for &n in outs {
            match self.alloc(op, n) {
                Ok((b, p)) => {
                    bufs.push(b);
                    ptrs.push(p);
                }
                Err(e) => {
                    self.release_all(bufs);
                    return Err(named(e));
                }
            }
        }
        let args: Vec<Arg> = raw
            .into_iter()
            .map(|r| r.unwrap_or_else(|k| Arg::Ptr(ptrs[k])))
            .collect();
        let Some((grid, block, shared)) = launch else {
            return Ok(bufs);
        };
        self.traffic.launch();
        match driver::launch(kernel, f, grid, block, shared, &args) {
            Ok(()) => Ok(bufs),
            Err(e) => {
                self.release_all(bufs);
                Err(named(e))
            }
        }
    }
}
