//! `tl train` under `mpirun`: data-parallel training, one rank per process (feature `mpi`;
//! docs/guide.md "Training on several processes"). Started by `mpirun -np N tl train …` with
//! the flags of a one-process run, the ranks split every global batch (`--batch-size`) and
//! average their gradients; rank 0 prints and writes the outputs.

use tl_nn::{Parameters, Runtime};
use tl_session::Train;

use crate::error::{CliError, Result};

/// The variables an MPI launcher sets to the rank count: Open MPI's, then MPICH's and Slurm's.
const RANK_VARS: [&str; 2] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"];

/// What a rank count should be, for its warning.
const RANKS_EXPECTS: &str = "a rank count (a positive integer)";

/// What is used in place of a bad rank count, for its warning.
fn ranks_instead() -> String {
    "one process (no data-parallel training)".to_owned()
}

/// The rank count an MPI launcher gave this process (Open MPI's `OMPI_COMM_WORLD_SIZE`,
/// MPICH's and Slurm's `PMI_SIZE`), if any; a value that is not a positive integer is one
/// warning and no rank count ([`tl_spec::env::read`]).
pub fn launched_ranks() -> Option<usize> {
    RANK_VARS.iter().find_map(|v| {
        tl_spec::env::read(
            v,
            RANKS_EXPECTS,
            tl_spec::env::parse_positive,
            ranks_instead,
        )
    })
}

/// Join the data-parallel group of the processes `mpirun` started, for `model`, with global
/// batch `batch`: this rank and the rank count; `(0, 1)` when not started by `mpirun` with
/// several ranks. An error when the ranks do not divide `batch`, or when this `tl` was built
/// without the `mpi` feature.
pub fn join<O: Train, M: Parameters>(
    rt: &mut Runtime<O>,
    model: &M,
    batch: usize,
) -> Result<(usize, usize)> {
    let Some(n) = launched_ranks().filter(|&n| n > 1) else {
        return Ok((0, 1));
    };
    #[cfg(feature = "mpi")]
    {
        use tl_nn::dist::Collective;
        let _ = n;
        let mpi = tl_nn::dist::Mpi::init()?;
        let (rank, size) = (mpi.rank(), mpi.size());
        if !batch.is_multiple_of(size) {
            return Err(CliError::usage(format!(
                "--batch-size {batch} is not a multiple of the {size} ranks mpirun started: each rank takes an equal part of every batch"
            )));
        }
        rt.data_parallel(model, Box::new(mpi))?;
        Ok((rank, size))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = (rt, model, batch);
        Err(CliError::new(format!(
            "started by mpirun with {n} ranks, but this tl was built without data-parallel training: build it with `cargo build --release -p tl-cli --features mpi`"
        )))
    }
}

/// Rank `rank`'s part of the global batch `idx` (of nominal size `batch`); `None` for a short
/// last batch when there are several ranks (it is left out, so every rank has equal parts).
pub fn shard(idx: &[usize], batch: usize, rank: usize, ranks: usize) -> Option<&[usize]> {
    if ranks <= 1 {
        return Some(idx);
    }
    if idx.len() < batch {
        return None;
    }
    let part = batch / ranks;
    idx.get(rank * part..(rank + 1) * part)
}

#[cfg(test)]
mod tests {
    use super::{RANKS_EXPECTS, ranks_instead, shard};

    #[test]
    fn a_bad_launcher_rank_count_warns_and_runs_one_process() {
        let read = |v: &str| {
            tl_spec::env::interpret(
                "PMI_SIZE",
                Some(v.as_ref()),
                RANKS_EXPECTS,
                tl_spec::env::parse_positive,
                ranks_instead,
            )
        };
        assert_eq!(read("4"), Ok(Some(4)));
        assert_eq!(read(""), Ok(None));
        assert_eq!(
            read("0").unwrap_err(),
            "warning: PMI_SIZE=\"0\" is not a rank count (a positive integer); using one \
             process (no data-parallel training)"
        );
    }

    #[test]
    fn shards_split_full_batches_and_leave_out_a_short_one() {
        let idx: Vec<usize> = (10..18).collect();
        assert_eq!(shard(&idx, 8, 0, 1), Some(&idx[..]));
        assert_eq!(shard(&idx[..5], 8, 0, 1), Some(&idx[..5]));
        assert_eq!(shard(&idx, 8, 0, 2), Some(&idx[..4]));
        assert_eq!(shard(&idx, 8, 1, 2), Some(&idx[4..]));
        assert_eq!(shard(&idx, 8, 3, 4), Some(&idx[6..]));
        assert_eq!(shard(&idx[..5], 8, 1, 2), None);
    }
}
