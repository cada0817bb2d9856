//! `external:CMD`: a policy in a process of the user's own. CMD runs through `sh -c`; each tick
//! it gets one [`Observation`] as a JSON line on stdin and answers one line on stdout:
//! `{"workers": N}` or `{"prefill": P, "decode": D}`. Its stderr passes through.
//!
//! Failures never stop or hang the run; the driver holds the current count and reports the
//! warning ([`PolicyError`]):
//! - an answer that is not a decision: that tick holds, the next tick asks again;
//! - no answer within the timeout: the process is killed and every later tick holds;
//! - the process exits or closes stdout (a crash): every later tick holds.
//!
//! The answers are read by a thread of their own so that a silent process can be timed out;
//! the engine's results depend only on the answers, so a deterministic program gives the same
//! run every time.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use super::policy::{Decision, Observation, Policy, PolicyError};

/// The longest answer line kept (longer ones are garbage).
const MAX_LINE_BYTES: usize = 1 << 20;

/// A running external policy.
#[derive(Debug)]
pub struct ExternalPolicy {
    /// The command, for messages.
    command: String,
    /// The process; None once it failed (then every tick holds).
    child: Option<Child>,
    /// Its stdin.
    stdin: Option<ChildStdin>,
    /// Its answer lines (an `Err` for an unreadable or overlong line); disconnected at EOF.
    answers: Receiver<Result<String, String>>,
    /// How long one answer may take (wall clock).
    timeout: Duration,
    /// Why it stopped, once it did: every later tick returns this.
    failed: Option<PolicyError>,
}

impl ExternalPolicy {
    /// Starts `command` through `sh -c`; it must answer each observation within `timeout`.
    pub fn spawn(command: &str, timeout: Duration) -> Result<ExternalPolicy, PolicyError> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| PolicyError::Io(format!("cannot start `sh -c {command:?}`: {e}")))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| PolicyError::Io("no stdout pipe".into()))?;
        let (tx, answers) = mpsc::channel();
        std::thread::Builder::new()
            .name("external-policy".into())
            .spawn(move || {
                let mut reader = BufReader::new(stdout);
                loop {
                    let mut line = Vec::new();
                    let read = (&mut reader)
                        .take(MAX_LINE_BYTES as u64 + 1)
                        .read_until(b'\n', &mut line);
                    let failed = read.is_err();
                    let answer = match read {
                        Ok(0) => return,
                        Ok(_) if line.len() > MAX_LINE_BYTES => {
                            Err(format!("an answer line over {MAX_LINE_BYTES} bytes"))
                        }
                        Ok(_) => String::from_utf8(line).map_err(|_| "not UTF-8".to_string()),
                        Err(e) => Err(format!("cannot read its output: {e}")),
                    };
                    if tx.send(answer).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| PolicyError::Io(format!("cannot start the reader thread: {e}")))?;
        Ok(ExternalPolicy {
            command: command.to_string(),
            child: Some(child),
            stdin,
            answers,
            timeout,
            failed: None,
        })
    }

    /// The command it runs.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// Stops the process (if still running) and remembers why every later tick holds.
    fn fail(&mut self, why: PolicyError) -> PolicyError {
        self.stdin = None;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.failed = Some(why.clone());
        why
    }

    /// The exit status of a process that closed its output.
    fn exit_status(&mut self) -> String {
        let Some(child) = self.child.as_mut() else {
            return "stopped".into();
        };
        // It closed stdout; give it a moment to exit before describing it.
        for _ in 0..50 {
            if let Ok(Some(status)) = child.try_wait() {
                return status.to_string();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        "closed its output".into()
    }
}

impl Policy for ExternalPolicy {
    fn name(&self) -> &'static str {
        "external"
    }

    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError> {
        if let Some(why) = &self.failed {
            return Err(why.clone());
        }
        let line = serde_json::to_string(obs).map_err(|e| PolicyError::Io(e.to_string()))?;
        let written = match self.stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "{line}").and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("stdin closed")),
        };
        if written.is_err() {
            let status = self.exit_status();
            return Err(self.fail(PolicyError::Exited { status }));
        }
        match self.answers.recv_timeout(self.timeout) {
            Ok(Ok(answer)) => {
                Decision::parse_line(&answer).map_err(|reason| PolicyError::Garbage {
                    line: answer.trim_end().chars().take(200).collect(),
                    reason,
                })
            }
            Ok(Err(reason)) => Err(PolicyError::Garbage {
                line: String::new(),
                reason,
            }),
            Err(RecvTimeoutError::Timeout) => Err(self.fail(PolicyError::Timeout {
                timeout_ms: self.timeout.as_millis() as u64,
            })),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.exit_status();
                Err(self.fail(PolicyError::Exited { status }))
            }
        }
    }
}

impl Drop for ExternalPolicy {
    fn drop(&mut self) {
        // Closing stdin lets a well-behaved policy exit; one that does not is killed.
        self.stdin = None;
        if let Some(mut child) = self.child.take() {
            for _ in 0..20 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscale::policy::tests::observation;

    fn spawn(cmd: &str) -> ExternalPolicy {
        ExternalPolicy::spawn(cmd, Duration::from_secs(5)).unwrap()
    }

    #[test]
    fn a_shell_policy_answers_each_observation() {
        // Answers one more worker than it sees ready, read from the JSON by sed.
        let mut p = spawn(
            r#"while read -r line; do n=$(echo "$line" | sed 's/.*"ready":\([0-9]*\).*/\1/'); echo "{\"workers\": $((n+1))}"; done"#,
        );
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 1.0)),
            Ok(Decision::Workers(4))
        );
        assert_eq!(
            p.decide(&observation(5, 0.1, 0, 1.0)),
            Ok(Decision::Workers(6))
        );
    }

    #[test]
    fn garbage_holds_that_tick_only() {
        let mut p = spawn(
            r#"read -r a; echo 'not json'; read -r b; echo '{"workers": 2}'; cat >/dev/null"#,
        );
        let err = p.decide(&observation(3, 0.1, 0, 1.0)).unwrap_err();
        assert!(matches!(err, PolicyError::Garbage { .. }), "{err}");
        assert!(err.to_string().contains("\"not json\""), "{err}");
        assert!(err.to_string().contains("holding the current count"));
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 1.0)),
            Ok(Decision::Workers(2))
        );
    }

    #[test]
    fn a_hanging_policy_times_out_and_holds_from_then_on() {
        let mut p = ExternalPolicy::spawn("sleep 30", Duration::from_millis(200)).unwrap();
        let started = std::time::Instant::now();
        let err = p.decide(&observation(3, 0.1, 0, 1.0)).unwrap_err();
        assert_eq!(err, PolicyError::Timeout { timeout_ms: 200 });
        // Killed: the next tick fails at once with the same reason.
        assert_eq!(p.decide(&observation(3, 0.1, 0, 1.0)), Err(err));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_crashing_policy_is_reported_and_held() {
        let mut p = spawn("read -r a; exit 3");
        let err = p.decide(&observation(3, 0.1, 0, 1.0)).unwrap_err();
        assert!(matches!(err, PolicyError::Exited { .. }), "{err}");
        assert!(err.to_string().contains('3'), "{err}");
        let again = p.decide(&observation(3, 0.1, 0, 1.0)).unwrap_err();
        assert_eq!(again, err);
    }
}
