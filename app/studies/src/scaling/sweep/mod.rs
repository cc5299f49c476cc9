//! Fine-tuning sweeps (seed 002, Algorithm 002-A at scale): vary the experts' fine-tuning
//! hyperparameters and the number of tasks, merge seeded task groups with several methods,
//! evaluate every task, and fit the scaling laws over the results.
//!
//! [`spec`] says what is varied (TOML, the `paper-002` preset), [`bench`] what is fine-tuned
//! (the demo benchmark of an image architecture, or the text benchmark), `cells` plans the
//! work, [`run`] does it and resumes a killed sweep from [`store`]'s results file, [`plots`]
//! turns the rows into the paper's plots with the laws fitted. [`executor`] runs the cells elsewhere (a Slurm array job)
//! through the same per-cell code and gathers their rows into the same results file.

pub mod bench;
mod cells;
pub mod executor;
pub mod plots;
pub mod run;
pub mod spec;
pub mod store;

pub use bench::{OpenBench, SweepBench, is_text_build, open_text_benchmark};
pub use cells::{diverged_file, expert_file};
pub use plots::{VariableResult, analyse, figures, fits_markdown, write_plots};
pub use run::{CellRun, SweepInputs, SweepProgress, SweepSummary, check_sweep, prepare_cells, run_one_cell, run_sweep};
pub use spec::{BenchKind, SweepSpec, Variable};
