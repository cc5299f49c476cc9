#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `mergescope sweep --executor slurm` against a real Slurm: the single-node cluster of
//! scripts/slurm-cluster.sh (installed with apt-get and started when missing), or the cluster
//! `SLURM_CONF` already names (`common::slurm::cluster`). Without one the cluster tests print
//! why and pass, unless MERGESCOPE_REQUIRE_SLURM=1 (CI), where they fail. Comparisons and
//! landscapes on Slurm: slurm_grids/.

mod common;
mod slurm_grids;

use common::slurm::*;
use common::*;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// A sweep of `mnist` and `letters` experts at K ∈ {6, 2, 4} (one group of both), merged by
/// TA and TIES: 3 × (2 experts + 2 merges) = 12 tiny cells. `extra` is appended.
fn spec(env: &Env, steps: &str, extra: &str) -> String {
    let bench = env.path("bench");
    if !bench.join("manifest.json").exists() {
        tiny_benchmark_of(&bench, &["mnist", "letters"]);
    }
    let path = env.path("spec.toml");
    std::fs::write(
        &path,
        format!(
            r#"arch = "mlp"
benchmark = "{}"
groups = 1
eval_examples = 50
[defaults]
lr = 1e-3
batch = 16
steps = 6
data_ratio = 1.0
optimizer = "adamw"
tasks = 2
[grid]
steps = {steps}
[[methods]]
plugin = "task-arithmetic"
label = "TA"
params = {{ lambda = "1/N" }}
[[methods]]
plugin = "ties"
label = "TIES"
{extra}"#,
            bench.display().to_string().replace('\\', "/")
        ),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

/// The results file's lines without the timing column, in file order.
fn lines(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("results.csv"))
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(',').unwrap().0.to_owned())
        .collect()
}

/// (modification time, inode) of each cell's result file: a cell computed again gets a new file.
#[cfg(unix)]
fn identities(cells: &Path) -> std::collections::BTreeMap<String, (SystemTime, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::read_dir(cells)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .map(|e| {
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (m.modified().unwrap(), m.ino()),
            )
        })
        .collect()
}

#[test]
fn a_sweep_on_slurm_writes_exactly_the_local_results() {
    let Some(conf) = cluster() else { return };
    let env = Env::new();
    let spec = spec(&env, "[2, 4]", "");
    let local = env.path("local");
    env.ok(&["sweep", &spec, "--out", s(&local), "--quiet"]);
    let slurm = env.path("slurm");
    let t0 = Instant::now();
    let o = slurm_cmd(
        &env,
        conf,
        &[
            "sweep",
            &spec,
            "--out",
            s(&slurm),
            "--quiet",
            "--executor",
            "slurm",
            "--poll-seconds",
            "0.2",
        ],
    )
    .output()
    .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    eprintln!("slurm sweep of 12 cells: {:.1} s\n{err}", t0.elapsed().as_secs_f64());
    let expected = lines(&local);
    assert_eq!(expected.len(), 1 + 3 * (2 + 2 * 2), "{expected:?}");
    assert_eq!(lines(&slurm), expected, "same values, same order");
    assert!(
        err.contains("12 cells (0 reused from an earlier run, 12 run in Slurm job"),
        "{err}"
    );
    first_result("12-cell sweep", &err);
    assert!(slurm.join("plots").join("steps-accuracy.png").is_file());
    assert!(slurm.join("fits.md").is_file());
    // Run again: everything is finished, nothing is submitted.
    let o = slurm_cmd(
        &env,
        conf,
        &["sweep", &spec, "--out", s(&slurm), "--quiet", "--executor", "slurm"],
    )
    .output()
    .unwrap();
    assert!(
        o.status.success() && stderr(&o).contains("all 12 cells were finished already"),
        "{}",
        stderr(&o)
    );
    assert_eq!(lines(&slurm), expected);
}

/// A `mergescope` command running in the background, its stderr read line by line.
struct Running {
    child: std::process::Child,
    reader: std::io::BufReader<std::process::ChildStderr>,
    log: String,
}

impl Running {
    fn start(env: &Env, conf: &str, args: &[&str]) -> Running {
        let mut child = slurm_cmd(env, conf, args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let reader = std::io::BufReader::new(child.stderr.take().unwrap());
        Running {
            child,
            reader,
            log: String::new(),
        }
    }

    /// Reads lines until one starts with `prefix`; returns the rest of that line.
    fn until(&mut self, prefix: &str) -> String {
        loop {
            let mut line = String::new();
            assert!(
                self.reader.read_line(&mut line).unwrap() > 0,
                "no line '{prefix}...': {}",
                self.log
            );
            self.log.push_str(&line);
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        }
    }

    /// The array job the command submits first.
    fn submitted_job(&mut self) -> String {
        self.until("submitted array job ").split(':').next().unwrap().to_owned()
    }

    /// Reads the rest of the output; the command's exit status.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        let rest: Vec<String> = self.reader.lines().map(|l| l.unwrap()).collect();
        self.log.push_str(&rest.join("\n"));
        (self.child.wait().unwrap(), self.log)
    }
}

/// Waits until cell 0 of the sweep in `out` has its result.
fn first_cell_done(out: &Path, log: &str) {
    let cells = out.join("slurm").join("cells");
    let t0 = Instant::now();
    while !cells.join("0.out").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no cell finished in 60 s: {log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(unix)]
#[test]
fn cancelled_array_tasks_are_reported_and_a_rerun_submits_only_them() {
    let Some(conf) = cluster() else { return };
    let env = Env::new();
    let spec = spec(&env, "[2, 4]", "");
    let out = env.path("sweep");
    let mut run = Running::start(
        &env,
        conf,
        &[
            "sweep",
            &spec,
            "--out",
            s(&out),
            "--quiet",
            "--executor",
            "slurm",
            "--array-parallelism",
            "1",
            "--max-retries",
            "0",
            "--poll-seconds",
            "0.2",
        ],
    );
    let job = run.submitted_job();
    // Mid-run: once a cell has finished, cancel the last two cells, still queued behind the
    // one-at-a-time limit.
    first_cell_done(&out, &run.log);
    let cells = out.join("slurm").join("cells");
    let o = Command::new("scancel")
        .env("SLURM_CONF", conf)
        .args([format!("{job}_10"), format!("{job}_11")])
        .output()
        .unwrap();
    assert!(o.status.success(), "scancel: {}", stderr(&o));
    let (status, log) = run.finish();
    assert!(!status.success(), "two cells have no result: {log}");
    for i in [10, 11] {
        assert!(
            log.contains(&format!("cell {i} (")) && log.contains("failed: CANCELLED"),
            "cell {i} reported with its Slurm state: {log}"
        );
    }
    assert!(log.contains("2 of 12 cells have no result"), "{log}");
    // Cells 10 and 11 are the K = 4 merges (two rows each): 19 lines less 4.
    assert_eq!(lines(&out).len(), 19 - 4, "the ten finished cells are gathered: {log}");
    let before = identities(&cells);
    assert_eq!(before.len(), 10, "{before:?}");
    let experts = out.join("models/experts/lr0.001_b16_a1_adamw/mnist.k6.safetensors");
    let expert_time = std::fs::metadata(&experts).unwrap().modified().unwrap();

    // Re-run: only the two cancelled cells are submitted; nothing finished is computed again.
    let o = slurm_cmd(
        &env,
        conf,
        &[
            "sweep",
            &spec,
            "--out",
            s(&out),
            "--quiet",
            "--executor",
            "slurm",
            "--poll-seconds",
            "0.2",
        ],
    )
    .output()
    .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(": 2 cells (10-11)"), "{err}");
    assert!(err.contains("(10 reused from an earlier run, 2 run in Slurm"), "{err}");
    let after = identities(&cells);
    assert_eq!(after.len(), 12);
    for (name, id) in &before {
        assert_eq!(after[name], *id, "{name} was written again");
    }
    assert_eq!(std::fs::metadata(&experts).unwrap().modified().unwrap(), expert_time);
    assert_eq!(lines(&out).len(), 19, "{err}");
}

#[test]
fn a_failing_cell_is_reported_with_its_log_and_the_others_finish() {
    let Some(conf) = cluster() else { return };
    let env = Env::new();
    // A third method whose λ is no number: each of its merges fails when it runs.
    let spec = spec(
        &env,
        "[]",
        "[[methods]]\nplugin = \"task-arithmetic\"\nlabel = \"BAD\"\nparams = { lambda = \"oops\" }\n",
    );
    let out = env.path("sweep");
    let o = slurm_cmd(
        &env,
        conf,
        &[
            "sweep",
            &spec,
            "--out",
            s(&out),
            "--quiet",
            "--executor",
            "slurm",
            "--poll-seconds",
            "0.2",
        ],
    )
    .output()
    .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    // Cells: 2 experts, TA, TIES, BAD (index 4).
    let line = err
        .lines()
        .find(|l| l.starts_with("cell 4 (") && l.contains("|BAD) failed: FAILED after 1 try:"))
        .unwrap_or_else(|| panic!("cell 4 not reported: {err}"));
    assert!(line.contains("lambda"), "the cell's own error: {line}");
    let log: PathBuf = err
        .lines()
        .find_map(|l| l.trim().strip_prefix("log: "))
        .map(PathBuf::from)
        .unwrap();
    assert!(log.starts_with(out.join("slurm/logs")), "{}", log.display());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("cell 4 failed:") && text.contains("lambda"), "{text}");
    assert!(err.contains("1 of 5 cells have no result"), "{err}");
    let rows = lines(&out);
    assert_eq!(rows.len(), 1 + 2 + 2 * 2, "{rows:?}");
    assert!(!rows.iter().any(|r| r.contains(",BAD,")));
}

/// No cluster needed: `--dry-run` prints the script of the cells still to run; without
/// Slurm's tools the error says what to install or use instead.
#[test]
fn dry_run_prints_the_batch_script_and_missing_sbatch_is_named() {
    let env = Env::new();
    let spec = spec(&env, "[]", "");
    let out = env.path("sweep");
    let o = env.ok(&[
        "sweep",
        &spec,
        "--out",
        s(&out),
        "--executor",
        "slurm",
        "--dry-run",
        "--partition",
        "gpu",
        "--time",
        "00:05:00",
        "--gpus",
        "1",
        "--array-parallelism",
        "3",
        "--mergescope-bin",
        "/shared/bin/mergescope",
    ]);
    for want in [
        "#SBATCH --array=0-3%3\n",
        "#SBATCH --partition=gpu\n",
        "#SBATCH --time=00:05:00\n",
        "#SBATCH --gres=gpu:1\n",
        "exec '/shared/bin/mergescope' 'grid' 'run-cell' '",
        "/sweep/slurm/grid.json' \"$SLURM_ARRAY_TASK_ID\"\n",
    ] {
        assert!(o.contains(want), "{want} not in\n{o}");
    }
    let empty = env.path("no-slurm");
    std::fs::create_dir_all(&empty).unwrap();
    let o = env
        .cmd()
        .env("PATH", &empty)
        .args(["sweep", &spec, "--out", s(&out), "--quiet", "--executor", "slurm"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("sbatch not found: install Slurm's client tools or use --executor local"),
        "{}",
        stderr(&o)
    );
}

/// A cell the scheduler kills is submitted again by the same command (up to --max-retries),
/// and the sweep completes.
#[test]
fn a_cell_killed_by_the_scheduler_is_retried() {
    let Some(conf) = cluster() else { return };
    let env = Env::new();
    let spec = spec(&env, "[]", "");
    let out = env.path("sweep");
    let mut run = Running::start(
        &env,
        conf,
        &[
            "sweep",
            &spec,
            "--out",
            s(&out),
            "--quiet",
            "--executor",
            "slurm",
            "--array-parallelism",
            "1",
            "--poll-seconds",
            "0.2",
        ],
    );
    let job = run.submitted_job();
    first_cell_done(&out, &run.log);
    let o = Command::new("scancel")
        .env("SLURM_CONF", conf)
        .arg(format!("{job}_3"))
        .output()
        .unwrap();
    assert!(o.status.success(), "scancel: {}", stderr(&o));
    let (status, log) = run.finish();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("cell 3 ended CANCELLED without a result") && log.contains("submitting it again (try 2 of 3)"),
        "{log}"
    );
    assert!(log.contains(": 1 cells (3)"), "{log}");
    assert!(log.contains("1 resubmitted after the scheduler killed them"), "{log}");
    assert_eq!(lines(&out).len(), 1 + 2 + 2 * 2, "{log}");
}

#[cfg(unix)]
#[test]
fn a_run_started_again_while_its_array_job_runs_watches_that_job() {
    let Some(conf) = cluster() else { return };
    let env = Env::new();
    let spec = spec(&env, "[2, 4]", "");
    let out = env.path("sweep");
    let args = [
        "sweep",
        spec.as_str(),
        "--out",
        s(&out),
        "--quiet",
        "--executor",
        "slurm",
        "--array-parallelism",
        "1",
        "--poll-seconds",
        "0.2",
    ];
    let mut first = Running::start(&env, conf, &args);
    let job = first.submitted_job();
    // The run dies (its terminal closed) once a cell has finished; its array job goes on. The
    // job's queued tasks are held so that it is surely still there when the run starts again.
    first_cell_done(&out, &first.log);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    // scontrol exits non-zero when some tasks have finished ("Job has already finished") and
    // acts on the others, so its status says nothing here; the second run's log does.
    let scontrol = |what: &str| {
        Command::new("scontrol")
            .env("SLURM_CONF", conf)
            .args([what, job.as_str()])
            .output()
            .unwrap();
    };
    scontrol("hold");

    let mut again = Running::start(&env, conf, &args);
    again.until(&format!("reattached to array job {job}"));
    scontrol("release");
    let (status, log) = again.finish();
    assert!(status.success(), "{log}");
    assert!(
        !log.contains("submitted array job"),
        "nothing is submitted twice: {log}"
    );
    assert_eq!(lines(&out).len(), 19, "every cell is gathered: {log}");
    // Each cell ran once: one log per cell, all of the one array job.
    let logs: Vec<String> = std::fs::read_dir(out.join("slurm").join("logs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cell-"))
        .collect();
    assert_eq!(logs.len(), 12, "{logs:?}");
    assert!(logs.iter().all(|n| n.ends_with(&format!(".{job}.log"))), "{logs:?}");
}
