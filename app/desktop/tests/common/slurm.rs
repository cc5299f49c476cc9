//! The real Slurm the `--executor slurm` tests run against (slurm.rs, slurm_grids.rs): the
//! single-node cluster of scripts/slurm-cluster.sh (installed with apt-get and started when
//! missing), or the cluster `SLURM_CONF` already names.

use super::Env;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Instant;

/// The `SLURM_CONF` of a running cluster, or None (with the reason printed) where there is
/// none and MERGESCOPE_REQUIRE_SLURM is not 1; with it set to 1 (CI), no cluster fails.
pub fn cluster() -> Option<&'static str> {
    static CLUSTER: OnceLock<Result<String, String>> = OnceLock::new();
    let c = CLUSTER.get_or_init(|| {
        let t0 = Instant::now();
        let (conf, said) = super::external::start_slurm()?;
        if !said.is_empty() {
            eprintln!("slurm cluster ready in {:.1} s: {said}", t0.elapsed().as_secs_f64());
        }
        Ok(conf)
    });
    match c {
        Ok(conf) => Some(conf),
        Err(why) if super::external::slurm_required() => {
            panic!("MERGESCOPE_REQUIRE_SLURM=1 but Slurm could not be started: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: no Slurm cluster ({why}); set MERGESCOPE_REQUIRE_SLURM=1 to fail instead");
            None
        }
    }
}

/// `mergescope` talking to the cluster `conf`.
pub fn slurm_cmd(env: &Env, conf: &str, args: &[&str]) -> Command {
    let mut c = env.cmd();
    c.env("SLURM_CONF", conf).args(args);
    c
}

/// A command's stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The submit-to-first-result time a Slurm run printed, printed again as MEASURED.
pub fn first_result(what: &str, err: &str) -> String {
    let first = err
        .lines()
        .find_map(|l| l.strip_prefix("first cell result "))
        .unwrap_or_else(|| panic!("no submit-to-first-result line: {err}"))
        .to_owned();
    eprintln!("MEASURED submit-to-first-result ({what}) on the test cluster: {first}");
    first
}
