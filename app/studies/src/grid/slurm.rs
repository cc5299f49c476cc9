//! The Slurm executor: a grid's missing cells as ONE array job (`sbatch --array`), a task per
//! cell running the grid's cell command with its index; watched with `squeue --states=all`
//! (`sacct` once the controller has forgotten the job); cells killed by the scheduler
//! (cancelled, time limit, node failure, preemption) are reported with their Slurm state and
//! submitted again up to a limit; cells that failed on their own are reported with their error
//! and log and not retried. Finished cells are never submitted again: their results are files.
//! The array job being watched is recorded in the work folder (`active-job.json`), so a run
//! started again while that job still runs (the first was killed, or its terminal closed)
//! watches it instead of submitting its cells a second time.

use super::{CellState, JOB_FILE, ranges};
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::writer::write_atomic;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How the array job is asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmOptions {
    /// `--partition` (default: the cluster's default partition).
    pub partition: Option<String>,
    /// `--time` per cell, e.g. `00:30:00` (default: the partition's limit).
    pub time: Option<String>,
    /// `--cpus-per-task`.
    pub cpus_per_task: usize,
    /// GPUs per cell (`--gres=gpu:G`).
    pub gpus: Option<u32>,
    /// `--mem` per cell, e.g. `4G` (default: the partition's).
    pub mem: Option<String>,
    /// At most this many cells at once (`--array=...%K`).
    pub array_parallelism: Option<usize>,
    /// Times a cell killed by the scheduler is submitted again.
    pub max_retries: usize,
    /// How often `squeue` is asked.
    pub poll: Duration,
    /// `--job-name`.
    pub job_name: String,
    /// Shell lines run before each cell (`module load cuda`, `source env.sh`).
    pub setup: Vec<String>,
    /// More `#SBATCH` options, e.g. `--account=proj` or `--qos=short`.
    pub sbatch_args: Vec<String>,
}

impl Default for SlurmOptions {
    fn default() -> Self {
        SlurmOptions {
            partition: None,
            time: None,
            cpus_per_task: 1,
            gpus: None,
            mem: None,
            array_parallelism: None,
            max_retries: 2,
            poll: Duration::from_secs(2),
            job_name: "mergescope".to_owned(),
            setup: Vec::new(),
            sbatch_args: Vec::new(),
        }
    }
}

/// The grid as the Slurm executor sees it.
pub struct SlurmGrid<'a> {
    /// Shared folder for the script, the logs and the cells' files (every node must see it).
    pub workdir: &'a Path,
    /// The command a task runs, its cell index appended (absolute paths: it runs on a node).
    pub command: Vec<String>,
    /// Environment the cells need, exported by the script.
    pub env: Vec<(String, String)>,
    /// What a cell's files say (a result is checked, not just found).
    pub state: &'a dyn Fn(usize) -> CellState,
}

/// Where an array job stands.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmProgress {
    /// The array job's id.
    pub job: String,
    /// Cells of this submission finished.
    pub done: usize,
    /// Cells in this submission.
    pub cells: usize,
    /// Of them, running now.
    pub running: usize,
    /// Of them, waiting in the queue.
    pub pending: usize,
    /// Seconds since the first submission.
    pub elapsed: f64,
    /// Something worth a line of its own (a cell killed and retried, a submission).
    pub event: Option<String>,
}

/// A cell that did not finish.
#[derive(Clone, Debug, PartialEq)]
pub struct CellFailure {
    /// The cell.
    pub index: usize,
    /// Its Slurm state (`FAILED`, `CANCELLED`, `TIMEOUT`, `NODE_FAIL`...; `UNKNOWN` when
    /// neither squeue nor sacct knows the task).
    pub state: String,
    /// The error the cell reported, if it reported one.
    pub error: Option<String>,
    /// Its log (of its last try).
    pub log: PathBuf,
    /// Times it was submitted.
    pub tries: usize,
}

/// What the executor did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlurmOutcome {
    /// The array jobs submitted, in order.
    pub jobs: Vec<String>,
    /// The cells of the first submission.
    pub submitted: Vec<usize>,
    /// Cells submitted again after the scheduler killed them.
    pub retried: usize,
    /// Cells without a result at the end.
    pub failed: Vec<CellFailure>,
    /// Seconds from the first `sbatch` to the first cell's result.
    pub first_result: Option<f64>,
}

/// States a job never leaves.
const TERMINAL: [&str; 11] = [
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
];

/// Terminal states in which the scheduler, not the cell, ended the task: worth another try.
const KILLED: [&str; 7] = [
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
];

fn base_state(state: &str) -> &str {
    // sacct writes "CANCELLED by 0".
    state.split_whitespace().next().unwrap_or(state)
}

/// Whether a task in `state` is over.
pub fn is_terminal(state: &str) -> bool {
    TERMINAL.contains(&base_state(state))
}

/// Whether a task in `state` was ended by the scheduler (and is retried).
pub fn is_killed(state: &str) -> bool {
    KILLED.contains(&base_state(state))
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The log of cell `index` in array job `job`.
pub fn log_path(workdir: &Path, job: &str, index: usize) -> PathBuf {
    workdir.join("logs").join(format!("cell-{index}.{job}.log"))
}

/// The batch script of an array job running cells `indices` of `grid`.
pub fn sbatch_script(opts: &SlurmOptions, grid: &SlurmGrid<'_>, indices: &[usize]) -> String {
    let mut array = ranges(indices);
    if let Some(k) = opts.array_parallelism {
        array.push_str(&format!("%{k}"));
    }
    let logs = grid.workdir.join("logs");
    let mut s = String::from("#!/bin/bash\n");
    let mut opt = |line: String| s.push_str(&format!("#SBATCH {line}\n"));
    opt(format!("--job-name={}", opts.job_name));
    opt(format!("--array={array}"));
    opt(format!("--output={}", logs.join("cell-%a.%A.log").display()));
    opt(format!("--cpus-per-task={}", opts.cpus_per_task));
    opt("--ntasks=1".to_owned());
    if let Some(p) = &opts.partition {
        opt(format!("--partition={p}"));
    }
    if let Some(t) = &opts.time {
        opt(format!("--time={t}"));
    }
    if let Some(m) = &opts.mem {
        opt(format!("--mem={m}"));
    }
    if let Some(g) = opts.gpus.filter(|&g| g > 0) {
        opt(format!("--gres=gpu:{g}"));
    }
    for a in &opts.sbatch_args {
        opt(a.clone());
    }
    s.push_str("# Written by mergescope: one array task per cell; a task runs the cell whose index\n");
    s.push_str("# is its SLURM_ARRAY_TASK_ID and writes the cell's result under the work folder.\n");
    s.push_str("set -euo pipefail\n");
    for (k, v) in &grid.env {
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    // One thread per CPU given (the results do not depend on the thread count).
    s.push_str("export RAYON_NUM_THREADS=\"${SLURM_CPUS_PER_TASK:-1}\"\n");
    for line in &opts.setup {
        s.push_str(line);
        s.push('\n');
    }
    let cmd: Vec<String> = grid.command.iter().map(|a| quote(a)).collect();
    s.push_str(&format!("exec {} \"$SLURM_ARRAY_TASK_ID\"\n", cmd.join(" ")));
    s
}

/// Runs Slurm's client `tool` with `args`; a missing tool is named with the fix.
fn slurm(tool: &str, args: &[&str]) -> Result<Output> {
    Command::new(tool).args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            EngineError::Invalid(format!(
                "{tool} not found: install Slurm's client tools or use --executor local"
            ))
        } else {
            EngineError::Invalid(format!("cannot run {tool}: {e}"))
        }
    })
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_owned()
}

/// Submits `script`; returns the job id.
fn submit(script: &Path) -> Result<String> {
    let path = script.to_string_lossy();
    let o = slurm("sbatch", &["--parsable", &path])?;
    if !o.status.success() {
        return Err(EngineError::Invalid(format!(
            "sbatch {path} failed: {}; check the partition, time and GPU options (the script is in that file)",
            stderr_of(&o)
        )));
    }
    let out = String::from_utf8_lossy(&o.stdout);
    let id = out.trim().split(';').next().unwrap_or("").trim().to_owned();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        return Err(EngineError::Invalid(format!(
            "sbatch {path} gave no job id (it printed '{}')",
            out.trim()
        )));
    }
    Ok(id)
}

/// Array task ids of an `%K` field (`3`, `2-5%2`, `[4,6-7%2]`); none for `N/A`.
fn task_ids(field: &str) -> Vec<usize> {
    let f = field.trim().trim_start_matches('[').trim_end_matches(']');
    let f = f.split('%').next().unwrap_or("");
    let mut out = Vec::new();
    for part in f.split(',') {
        let part = part.split(':').next().unwrap_or("");
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<usize>().ok()),
        }
    }
    out
}

/// The state of each task of array job `job`, from `squeue --states=all` or, once the
/// controller has forgotten the job, `sacct`. None when neither knows it.
fn task_states(job: &str) -> Result<Option<BTreeMap<usize, String>>> {
    let o = slurm("squeue", &["-h", "--states=all", "-j", job, "-o", "%K|%T"])?;
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    if o.status.success() && !text.trim().is_empty() {
        return Ok(Some(parse_states(&text, false)));
    }
    let err = stderr_of(&o);
    if !o.status.success() && !err.contains("Invalid job id") {
        return Err(EngineError::Invalid(format!(
            "squeue -j {job} failed: {err}; is slurmctld reachable from this machine?"
        )));
    }
    // Forgotten by the controller: accounting may still know it.
    Ok(sacct_states(job))
}

/// The states accounting (`sacct`) has for the tasks of `job`; None without accounting.
fn sacct_states(job: &str) -> Option<BTreeMap<usize, String>> {
    match slurm("sacct", &["-n", "-P", "-X", "-j", job, "--format=JobID,State"]) {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            (!text.trim().is_empty()).then(|| parse_states(&text, true))
        }
        _ => None,
    }
}

/// Gives a state to the tasks of `round` that the controller no longer lists: accounting's,
/// else CANCELLED for a task that never started (a pending array task cancelled with
/// `scancel` leaves the queue without a trace; it never opened its log), else UNKNOWN.
fn fill_absent(workdir: &Path, job: &str, round: &[usize], states: &mut BTreeMap<usize, String>) {
    let absent: Vec<usize> = round.iter().copied().filter(|i| !states.contains_key(i)).collect();
    if absent.is_empty() {
        return;
    }
    let sacct = sacct_states(job).unwrap_or_default();
    for i in absent {
        let state = match sacct.get(&i) {
            Some(s) => s.clone(),
            None if !log_path(workdir, job, i).exists() => "CANCELLED".to_owned(),
            None => "UNKNOWN".to_owned(),
        };
        states.insert(i, state);
    }
}

/// `squeue -o %K|%T` lines, or `sacct -o JobID,State` lines (`12_3|CANCELLED by 0`,
/// `12_[4-5]|PENDING`).
fn parse_states(text: &str, sacct: bool) -> BTreeMap<usize, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((id, state)) = line.split_once('|') else {
            continue;
        };
        let ids = if sacct {
            id.split_once('_').map_or(Vec::new(), |(_, t)| task_ids(t))
        } else {
            task_ids(id)
        };
        for i in ids {
            out.insert(i, state.trim().to_owned());
        }
    }
    out
}

/// Cancels array job `job` (on Ctrl-C).
fn cancel_job(job: &str) {
    let _ = slurm("scancel", &[job]);
}

/// The array job a run is watching, recorded in the work folder while it is watched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ActiveJob {
    /// The array job's id.
    job: String,
    /// The cells it runs.
    cells: Vec<usize>,
    /// SHA-256 of the grid file the cells read, when it was submitted.
    grid_sha256: String,
}

const ACTIVE_JOB_FILE: &str = "active-job.json";

/// SHA-256 (hex) of the work folder's grid file; empty when there is none.
fn grid_digest(workdir: &Path) -> String {
    std::fs::read(workdir.join(JOB_FILE))
        .map(|b| Sha256::digest(&b).iter().map(|x| format!("{x:02x}")).collect())
        .unwrap_or_default()
}

/// Records `job` (cells `cells`) as the array job being watched.
fn record_active(workdir: &Path, job: &str, cells: &[usize]) -> Result<()> {
    let record = ActiveJob {
        job: job.to_owned(),
        cells: cells.to_vec(),
        grid_sha256: grid_digest(workdir),
    };
    let text = serde_json::to_vec_pretty(&record).map_err(|e| EngineError::Bug(e.to_string()))?;
    write_atomic(&workdir.join(ACTIVE_JOB_FILE), &text)
}

/// Forgets the array job being watched (it is over, or was cancelled).
fn clear_active(workdir: &Path) {
    let _ = std::fs::remove_file(workdir.join(ACTIVE_JOB_FILE));
}

/// An array job an earlier run submitted that still runs cells of `todo`: its id and those
/// cells. An earlier job still running cells of another grid in this work folder is an error
/// (two grids would share the cells' files).
fn live_earlier_job(workdir: &Path, todo: &[usize]) -> Result<Option<(String, Vec<usize>)>> {
    let path = workdir.join(ACTIVE_JOB_FILE);
    let Ok(text) = std::fs::read(&path) else {
        return Ok(None);
    };
    let Ok(record) = serde_json::from_slice::<ActiveJob>(&text) else {
        clear_active(workdir);
        return Ok(None);
    };
    let Some(states) = task_states(&record.job)? else {
        clear_active(workdir);
        return Ok(None);
    };
    let live: Vec<usize> = record
        .cells
        .iter()
        .copied()
        .filter(|i| states.get(i).is_some_and(|s| !is_terminal(s)))
        .collect();
    if live.is_empty() {
        clear_active(workdir);
        return Ok(None);
    }
    if record.grid_sha256 != grid_digest(workdir) {
        return Err(EngineError::Invalid(format!(
            "array job {} from an earlier run still runs {} cell(s) of another grid in the work folder '{}'; \
             wait for it, cancel it (scancel {}), or give this grid another --workdir",
            record.job,
            live.len(),
            workdir.display(),
            record.job
        )));
    }
    Ok(Some((
        record.job,
        live.into_iter().filter(|i| todo.contains(i)).collect(),
    )))
}

/// Submits cells `todo` of `grid` as one array job, watches it until every task is over,
/// submits the cells the scheduler killed again (up to `opts.max_retries` times), and
/// returns what became of them. `progress` hears about each poll. On `cancel` the job is
/// cancelled (finished cells stay).
pub fn run_array(
    opts: &SlurmOptions,
    grid: &SlurmGrid<'_>,
    todo: &[usize],
    progress: &dyn Fn(&SlurmProgress),
    cancel: &AtomicBool,
) -> Result<SlurmOutcome> {
    let logs = grid.workdir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| EngineError::io("cannot create", &logs, e))?;
    let started = Instant::now();
    let mut outcome = SlurmOutcome {
        submitted: todo.to_vec(),
        ..SlurmOutcome::default()
    };
    let mut tries: BTreeMap<usize, usize> = BTreeMap::new();
    let mut round: Vec<usize> = todo.to_vec();
    // A job an earlier run left running is watched first; the other cells are submitted after.
    let mut earlier = live_earlier_job(grid.workdir, todo)?.filter(|(_, live)| !live.is_empty());
    let mut later = Vec::new();
    if let Some((_, live)) = &earlier {
        later = todo.iter().copied().filter(|i| !live.contains(i)).collect();
        round.clone_from(live);
    }
    while !round.is_empty() {
        for &i in &round {
            *tries.entry(i).or_default() += 1;
        }
        let (job, event) = match earlier.take() {
            Some((job, _)) => {
                let event = format!(
                    "reattached to array job {job}, which an earlier run submitted: {} cells ({}) still running \
                     or queued",
                    round.len(),
                    ranges(&round)
                );
                (job, event)
            }
            None => {
                let script = grid.workdir.join("cells.sbatch");
                write_atomic(&script, sbatch_script(opts, grid, &round).as_bytes())?;
                let job = submit(&script)?;
                record_active(grid.workdir, &job, &round)?;
                let event = format!("submitted array job {job}: {} cells ({})", round.len(), ranges(&round));
                (job, event)
            }
        };
        outcome.jobs.push(job.clone());
        let mut report = SlurmProgress {
            job: job.clone(),
            done: 0,
            cells: round.len(),
            running: 0,
            pending: round.len(),
            elapsed: started.elapsed().as_secs_f64(),
            event: Some(event),
        };
        progress(&report);
        let mut states = watch(
            opts.poll,
            grid,
            &job,
            &round,
            started,
            &mut outcome,
            &mut report,
            progress,
            cancel,
        )?;
        clear_active(grid.workdir);
        fill_absent(grid.workdir, &job, &round, &mut states);
        let mut next = Vec::new();
        for &i in &round {
            let log = log_path(grid.workdir, &job, i);
            let state = states.get(&i).cloned().unwrap_or_else(|| "UNKNOWN".to_owned());
            match (grid.state)(i) {
                CellState::Done => {}
                CellState::Failed(error) => outcome.failed.push(CellFailure {
                    index: i,
                    state,
                    error: Some(error),
                    log,
                    tries: tries[&i],
                }),
                CellState::Missing if is_killed(&state) && tries[&i] <= opts.max_retries => {
                    report.event = Some(format!(
                        "cell {i} ended {state} without a result (log {}); submitting it again (try {} of {})",
                        log.display(),
                        tries[&i] + 1,
                        opts.max_retries + 1
                    ));
                    progress(&report);
                    next.push(i);
                }
                CellState::Missing => outcome.failed.push(CellFailure {
                    index: i,
                    state,
                    error: None,
                    log,
                    tries: tries[&i],
                }),
            }
        }
        outcome.retried += next.len();
        next.append(&mut later);
        round = next;
    }
    Ok(outcome)
}

/// Runs cells `todo` of `grid` whose cells need others first (`needs(i)`: the cells whose
/// results cell `i` reads): each round submits, as one array job ([`run_array`]), the cells
/// whose needs all have results, until none is left. A cell whose needs end without a result
/// is not submitted; it is reported with the cells it waited for (`tries` 0).
pub fn run_in_stages(
    opts: &SlurmOptions,
    grid: &SlurmGrid<'_>,
    todo: &[usize],
    needs: &dyn Fn(usize) -> Vec<usize>,
    progress: &dyn Fn(&SlurmProgress),
    cancel: &AtomicBool,
) -> Result<SlurmOutcome> {
    let started = Instant::now();
    let mut total = SlurmOutcome {
        submitted: Vec::new(),
        ..SlurmOutcome::default()
    };
    let mut remaining = todo.to_vec();
    while !remaining.is_empty() {
        let ready_now = |i: &usize| needs(*i).iter().all(|&d| (grid.state)(d) == CellState::Done);
        let (ready, waiting): (Vec<usize>, Vec<usize>) = remaining.iter().partition(|i| ready_now(i));
        if ready.is_empty() {
            for i in waiting {
                let without: Vec<String> = needs(i)
                    .into_iter()
                    .filter(|&d| (grid.state)(d) != CellState::Done)
                    .map(|d| d.to_string())
                    .collect();
                total.failed.push(CellFailure {
                    index: i,
                    state: "NOT_SUBMITTED".to_owned(),
                    error: Some(format!(
                        "it needs the results of cell(s) {}, which have none",
                        without.join(", ")
                    )),
                    log: PathBuf::new(),
                    tries: 0,
                });
            }
            break;
        }
        let offset = started.elapsed().as_secs_f64();
        let o = run_array(opts, grid, &ready, progress, cancel)?;
        total.jobs.extend(o.jobs);
        total.submitted.extend(o.submitted);
        total.retried += o.retried;
        total.failed.extend(o.failed);
        if total.first_result.is_none() {
            total.first_result = o.first_result.map(|s| s + offset);
        }
        remaining = waiting;
    }
    total.submitted.sort_unstable();
    total.failed.sort_by_key(|f| f.index);
    Ok(total)
}

/// Polls job `job` (cells `round`) until all its tasks are over; returns their last states.
#[allow(clippy::too_many_arguments)]
fn watch(
    every: Duration,
    grid: &SlurmGrid<'_>,
    job: &str,
    round: &[usize],
    started: Instant,
    outcome: &mut SlurmOutcome,
    report: &mut SlurmProgress,
    progress: &dyn Fn(&SlurmProgress),
    cancel: &AtomicBool,
) -> Result<BTreeMap<usize, String>> {
    let poll = |d: Duration| {
        let until = Instant::now() + d;
        while Instant::now() < until && !cancel.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50).min(d));
        }
    };
    let mut last: BTreeMap<usize, String> = BTreeMap::new();
    let mut first = true;
    // Tasks missing from the listing twice in a row have left the queue (cancelled while
    // pending, or ended and forgotten).
    let mut absent_before = false;
    loop {
        if !first {
            poll(every);
        }
        first = false;
        if cancel.load(Ordering::Relaxed) {
            cancel_job(job);
            return Err(EngineError::Cancelled);
        }
        let states = task_states(job)?;
        let done = round.iter().filter(|&&i| (grid.state)(i) == CellState::Done).count();
        if done > 0 && outcome.first_result.is_none() {
            outcome.first_result = Some(started.elapsed().as_secs_f64());
        }
        let count = |s: &str| {
            states
                .as_ref()
                .map_or(0, |m| round.iter().filter(|i| m.get(i).is_some_and(|x| x == s)).count())
        };
        report.done = done;
        report.running = count("RUNNING") + count("COMPLETING");
        report.pending = count("PENDING");
        report.elapsed = started.elapsed().as_secs_f64();
        report.event = None;
        progress(report);
        match states {
            Some(m) => {
                let absent = round.iter().any(|i| !m.contains_key(i));
                let over = round.iter().all(|i| m.get(i).is_none_or(|s| is_terminal(s)));
                last = m;
                if over && (!absent || absent_before) {
                    return Ok(last);
                }
                absent_before = absent;
            }
            // Neither squeue nor sacct knows the job any more: it is over.
            None => return Ok(last),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_and_sacct_lines_give_each_tasks_state() {
        let m = parse_states("3|RUNNING\n4-6%2|PENDING\n[8,10]|PENDING\n2|CANCELLED\n", false);
        assert_eq!(m[&3], "RUNNING");
        assert_eq!(m[&5], "PENDING");
        assert_eq!(m[&10], "PENDING");
        assert!(!m.contains_key(&9));
        let m = parse_states("12_3|CANCELLED by 0\n12_[4-5]|PENDING\n", true);
        assert_eq!(m[&3], "CANCELLED by 0");
        assert!(is_killed(&m[&3]) && is_terminal(&m[&3]));
        assert_eq!(m[&5], "PENDING");
        assert!(!is_terminal("COMPLETING") && is_terminal("TIMEOUT") && !is_killed("FAILED"));
    }

    #[test]
    fn the_script_runs_the_cell_of_its_array_index_with_the_options_asked_for() {
        let grid = SlurmGrid {
            workdir: Path::new("/shared/w"),
            command: vec![
                "/opt/ms bin/mergescope".into(),
                "sweep".into(),
                "run-cell".into(),
                "/shared/w/grid.json".into(),
            ],
            env: vec![("MERGESCOPE_DATA_DIR".into(), "/shared/it's".into())],
            state: &|_| CellState::Missing,
        };
        let opts = SlurmOptions {
            partition: Some("gpu".into()),
            time: Some("00:10:00".into()),
            gpus: Some(1),
            array_parallelism: Some(4),
            setup: vec!["module load cuda".into()],
            sbatch_args: vec!["--account=proj".into()],
            ..SlurmOptions::default()
        };
        let s = sbatch_script(&opts, &grid, &[0, 1, 2, 5]);
        for line in [
            "#SBATCH --array=0-2,5%4\n",
            "#SBATCH --output=/shared/w/logs/cell-%a.%A.log\n",
            "#SBATCH --partition=gpu\n",
            "#SBATCH --time=00:10:00\n",
            "#SBATCH --gres=gpu:1\n",
            "#SBATCH --account=proj\n",
            "export MERGESCOPE_DATA_DIR='/shared/it'\\''s'\n",
            "module load cuda\n",
            "exec '/opt/ms bin/mergescope' 'sweep' 'run-cell' '/shared/w/grid.json' \"$SLURM_ARRAY_TASK_ID\"\n",
        ] {
            assert!(s.contains(line), "{line} not in\n{s}");
        }
        assert!(s.starts_with("#!/bin/bash\n#SBATCH"));
    }
}
