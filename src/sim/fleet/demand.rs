//! Demand from real traces: each inference service's GPU instances alive over time
//! (Alibaba DLRM inference 2025), and the shapes of training and batch tasks (the
//! best-effort and burstable tasks of the Alibaba GPU trace 2023), resampled into a
//! seeded arrival stream.

use super::super::trace::{unset, Table};
use super::super::{Error, Result};
use crate::placement::SplitMix64;
use crate::quota::Time;

/// One inference service: how many GPU instances it needed over time.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    pub name: String,
    /// GPUs per instance (every instance of a service asks the same in the trace).
    pub gpus: u8,
    /// `(from, instances)`, sorted by time, the first at 0: a step function.
    pub steps: Vec<(Time, u32)>,
}

impl Service {
    /// Instances alive at `t`.
    pub fn at(&self, t: Time) -> u32 {
        let i = self.steps.partition_point(|(from, _)| *from <= t);
        if i == 0 {
            0
        } else {
            self.steps[i - 1].1
        }
    }

    /// The most instances alive in `[0, until]`.
    pub fn peak(&self, until: Time) -> u32 {
        self.steps
            .iter()
            .take_while(|(t, _)| *t <= until)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }

    /// Mean instances alive over `[0, until)`.
    pub fn mean(&self, until: Time) -> f64 {
        if until == 0 {
            return f64::from(self.at(0));
        }
        let mut area = 0.0;
        for (i, &(from, n)) in self.steps.iter().enumerate() {
            if from >= until {
                break;
            }
            let to = self.steps.get(i + 1).map_or(until, |s| s.0.min(until));
            area += f64::from(n) * (to - from) as f64;
        }
        area / until as f64
    }
}

/// Parses the DLRM instance list (`app_name,gpu_request,creation_time,deletion_time`,
/// times in seconds from the trace start, empty or `nan` for before the start / after
/// the end) into one demand curve per service, in order of first appearance.
pub fn parse_services(text: &str, file: &str) -> Result<Vec<Service>> {
    let table = Table::parse(text, file)?;
    let app = table.column("app_name")?;
    let gpu = table.column("gpu_request")?;
    let created = table.column("creation_time")?;
    let deleted = table.column("deletion_time")?;
    let mut names: Vec<String> = Vec::new();
    let mut gpus: Vec<u8> = Vec::new();
    let mut changes: Vec<Vec<(Time, i64)>> = Vec::new();
    let seconds = |line: usize, row: &[&str], col: usize| -> Result<Option<Time>> {
        if unset(row[col]) {
            return Ok(None);
        }
        let s: f64 = table.num(line, row, col)?;
        if !(s.is_finite() && s >= 0.0) {
            return Err(table.bad(line, format!("time `{}` is not a time", row[col])));
        }
        Ok(Some((s * 1000.0).round() as Time))
    };
    for (line, row) in &table.rows {
        let g: u8 = table.num(*line, row, gpu)?;
        if g == 0 {
            continue;
        }
        let name = row[app];
        let i = match names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                names.push(name.to_string());
                gpus.push(g);
                changes.push(Vec::new());
                names.len() - 1
            }
        };
        if gpus[i] != g {
            return Err(table.bad(
                *line,
                format!("{name}: instances ask {} and {g} GPUs", gpus[i]),
            ));
        }
        let from = seconds(*line, row, created)?.unwrap_or(0);
        let to = seconds(*line, row, deleted)?;
        if to.is_some_and(|to| to < from) {
            return Err(table.bad(*line, "deleted before it was created".into()));
        }
        changes[i].push((from, 1));
        if let Some(to) = to {
            changes[i].push((to, -1));
        }
    }
    if names.is_empty() {
        return Err(Error::Empty(file.into()));
    }
    Ok(names
        .into_iter()
        .zip(gpus)
        .zip(changes)
        .map(|((name, gpus), mut ch)| {
            ch.sort_unstable();
            let mut steps: Vec<(Time, u32)> = vec![(0, 0)];
            let mut n = 0i64;
            for (t, d) in ch {
                n += d;
                let v = n.max(0) as u32;
                match steps.last_mut() {
                    Some(last) if last.0 == t => last.1 = v,
                    _ => steps.push((t, v)),
                }
            }
            steps.dedup_by(|b, a| a.1 == b.1);
            Service { name, gpus, steps }
        })
        .collect())
}

/// Tokens per minute (prompt + generated) of an Azure LLM inference trace 2023 file
/// (`TIMESTAMP,ContextTokens,GeneratedTokens`, one request per line, about an hour of
/// one day), minute 0 holding the first request's minute.
pub fn parse_llm_tokens_per_minute(text: &str, file: &str) -> Result<Vec<f64>> {
    let table = Table::parse(text, file)?;
    let stamp = table.column("TIMESTAMP")?;
    let context = table.column("ContextTokens")?;
    let generated = table.column("GeneratedTokens")?;
    let mut first: Option<(String, u64)> = None;
    let mut minutes: Vec<f64> = Vec::new();
    for (line, row) in &table.rows {
        let (day, second) = day_and_second(row[stamp]).ok_or_else(|| {
            table.bad(
                *line,
                format!(
                    "TIMESTAMP `{}` is not `YYYY-MM-DD hh:mm:ss[.f]`",
                    row[stamp]
                ),
            )
        })?;
        let (first_day, start) = first.get_or_insert_with(|| (day.to_string(), second));
        if day != first_day.as_str() || second < *start {
            return Err(table.bad(*line, "requests must be of one day, in time order".into()));
        }
        let minute = ((second - *start) / 60) as usize;
        if minute >= 24 * 60 {
            return Err(table.bad(*line, "more than a day after the first request".into()));
        }
        let tokens: f64 =
            table.num::<f64>(*line, row, context)? + table.num::<f64>(*line, row, generated)?;
        if !(tokens.is_finite() && tokens >= 0.0) {
            return Err(table.bad(*line, "token counts must be at least 0".into()));
        }
        if minutes.len() <= minute {
            minutes.resize(minute + 1, 0.0);
        }
        minutes[minute] += tokens;
    }
    if minutes.iter().all(|m| *m == 0.0) {
        return Err(Error::Empty(format!("{file} (no tokens)")));
    }
    // The last minute is cut short by the trace's end: leave it out.
    if minutes.len() > 1 {
        minutes.pop();
    }
    Ok(minutes)
}

/// `("2023-11-16", seconds of that day)` of `2023-11-16 18:15:46.6805900`.
fn day_and_second(stamp: &str) -> Option<(&str, u64)> {
    let (day, clock) = stamp.trim().split_once(' ')?;
    let mut parts = clock.split(':');
    let h: u64 = parts.next()?.parse().ok()?;
    let m: u64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || h > 23 || m > 59 || !(0.0..61.0).contains(&s) {
        return None;
    }
    Some((day, h * 3600 + m * 60 + s as u64))
}

/// The diurnal envelope LLM load is tiled under: 1 at 14:00, `trough` at 02:00, a
/// raised cosine between (simulated time 0 is midnight).
pub fn diurnal(t: Time, trough: f64) -> f64 {
    let hours = t as f64 / 3_600_000.0;
    let phase = 2.0 * std::f64::consts::PI * (hours - 14.0) / 24.0;
    trough + (1.0 - trough) * (1.0 + phase.cos()) / 2.0
}

/// An LLM service whose demand follows `tokens_per_minute` (an hour of real requests,
/// tiled) under the [`diurnal`] envelope, scaled so that its busiest minute over
/// `[0, until]` needs `peak` instances of one GPU each.
pub fn llm_service(
    name: &str,
    tokens_per_minute: &[f64],
    peak: u32,
    trough: f64,
    until: Time,
) -> Service {
    const MINUTE: Time = 60_000;
    let load = |m: u64| {
        let i = (m % tokens_per_minute.len().max(1) as u64) as usize;
        tokens_per_minute.get(i).copied().unwrap_or(0.0) * diurnal(m * MINUTE, trough)
    };
    let minutes = until / MINUTE + 1;
    let busiest = (0..minutes).map(load).fold(0.0f64, f64::max);
    let mut steps: Vec<(Time, u32)> = Vec::new();
    for m in 0..minutes {
        let n = if busiest > 0.0 {
            (f64::from(peak) * load(m) / busiest).ceil() as u32
        } else {
            0
        };
        if steps.last().is_none_or(|&(_, last)| last != n) {
            steps.push((m * MINUTE, n));
        }
    }
    Service {
        name: name.to_string(),
        gpus: 1,
        steps,
    }
}

/// The two LLM services of a run: `conv` and `code` (the Azure trace's files), each
/// peaking at half of `peak_gpus` over `[0, until]` (none when `peak_gpus` is 0).
pub fn azure_llm_services(
    conv: (&str, &str),
    code: (&str, &str),
    peak_gpus: u32,
    trough: f64,
    until: Time,
) -> Result<Vec<Service>> {
    if peak_gpus == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for ((text, file), name, peak) in [
        (conv, "azure-llm-conv", peak_gpus.div_ceil(2)),
        (code, "azure-llm-code", peak_gpus / 2),
    ] {
        if peak > 0 {
            let tokens = parse_llm_tokens_per_minute(text, file)?;
            out.push(llm_service(name, &tokens, peak, trough, until));
        }
    }
    Ok(out)
}

/// The shape of one training or batch task of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskShape {
    /// GPUs per task (one pod).
    pub num_gpu: u8,
    /// Share of each GPU, in milli (1000 = whole).
    pub gpu_milli: u16,
    /// How long it runs when not interrupted: `deletion_time - creation_time`.
    pub duration: Time,
    /// The GPU models it may run on (the trace's `gpu_spec`), as a set of bits over the
    /// fleet's models in `--gpu-models` order; `None`: any model.
    pub models: Option<u64>,
}

impl TaskShape {
    /// GPU-milli the task uses.
    pub fn milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }
}

/// The best-effort (`BE`) and `Burstable` GPU tasks of an Alibaba GPU trace 2023 pod
/// list (`num_gpu,gpu_milli,qos,creation_time,deletion_time`). The trace has no run
/// time: a task's duration is taken as `deletion_time - creation_time` (the pod's
/// lifetime, queueing in Alibaba's cluster included). Tasks without GPUs or with a
/// lifetime of zero are left out.
pub fn parse_tasks(text: &str, file: &str) -> Result<Vec<TaskShape>> {
    Ok(parse_tasks_on(text, file, &[])?.shapes)
}

/// The tasks of a pod list for a fleet of these GPU models.
#[derive(Debug, Clone, PartialEq)]
pub struct Tasks {
    pub shapes: Vec<TaskShape>,
    /// Tasks left out because their `gpu_spec` names none of the fleet's models.
    pub left_out: usize,
}

/// Like [`parse_tasks`], honouring the trace's `gpu_spec` column (models separated by
/// `|`) against the fleet's `models`: a task keeps the models of its list the fleet has
/// ([`TaskShape::models`]), and one whose list names none of them is left out (it could
/// never run). With no `models`, or no `gpu_spec` column, every task may run anywhere.
pub fn parse_tasks_on(text: &str, file: &str, models: &[&str]) -> Result<Tasks> {
    let table = Table::parse(text, file)?;
    let spec = table.column("gpu_spec").ok().filter(|_| !models.is_empty());
    let mut left_out = 0;
    let num_gpu = table.column("num_gpu")?;
    let gpu_milli = table.column("gpu_milli")?;
    let qos = table.column("qos")?;
    let created = table.column("creation_time")?;
    let deleted = table.column("deletion_time")?;
    let mut out = Vec::new();
    for (line, row) in &table.rows {
        if !matches!(row[qos], "BE" | "Burstable") {
            continue;
        }
        let n: u8 = table.num(*line, row, num_gpu)?;
        let m: u16 = table.num(*line, row, gpu_milli)?;
        if n == 0 || m == 0 {
            continue;
        }
        if m > 1000 {
            return Err(table.bad(*line, format!("gpu_milli {m} is over 1000")));
        }
        let from: u64 = table.num(*line, row, created)?;
        let to: u64 = table.num(*line, row, deleted)?;
        if to <= from {
            continue;
        }
        let allowed = match spec.map(|c| row[c].trim()) {
            Some(list) if !list.is_empty() => {
                let mask = list
                    .split('|')
                    .filter_map(|name| models.iter().position(|m| *m == name.trim()))
                    .fold(0u64, |mask, i| mask | 1 << i);
                if mask == 0 {
                    left_out += 1;
                    continue;
                }
                Some(mask)
            }
            _ => None,
        };
        out.push(TaskShape {
            num_gpu: n,
            gpu_milli: m,
            duration: (to - from).saturating_mul(1000),
            models: allowed,
        });
    }
    if out.is_empty() {
        let why = if left_out > 0 {
            format!("{file} (every BE or Burstable GPU task asks for models the fleet lacks)")
        } else {
            format!("{file} (no BE or Burstable GPU tasks)")
        };
        return Err(Error::Empty(why));
    }
    Ok(Tasks {
        shapes: out,
        left_out,
    })
}

/// One training job of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    pub arrival: Time,
    pub shape: TaskShape,
    /// Checkpoints every this long while it runs.
    pub checkpoint: Time,
}

/// How training demand is drawn from the task shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrivals {
    /// Mean GPUs of training work offered (GPU-milli / 1000, at the tasks' own sizes).
    pub offered_gpus: f64,
    /// Until when jobs arrive.
    pub until: Time,
    /// Checkpoint interval: log-uniform between these (ms).
    pub checkpoint: (Time, Time),
    pub seed: u64,
}

/// Poisson arrivals of tasks resampled uniformly from `shapes`, at the rate that offers
/// `offered_gpus` of work on average (durations cut at `until` when computing the rate,
/// so a task longer than the run counts only for the run).
pub fn arrivals(shapes: &[TaskShape], a: &Arrivals) -> Vec<Job> {
    if shapes.is_empty() || a.offered_gpus <= 0.0 || a.until == 0 {
        return Vec::new();
    }
    let mean_work = shapes
        .iter()
        .map(|s| s.milli() as f64 / 1000.0 * s.duration.min(a.until) as f64)
        .sum::<f64>()
        / shapes.len() as f64;
    let rate = a.offered_gpus / mean_work.max(1.0); // jobs per ms
    let mut rng = SplitMix64::new(a.seed);
    let mut uniform = move || ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (lo, hi) = (a.checkpoint.0.max(1) as f64, a.checkpoint.1.max(1) as f64);
    let mut t = 0.0f64;
    let mut out = Vec::new();
    loop {
        t += -uniform().ln() / rate;
        if t >= a.until as f64 {
            return out;
        }
        let i = ((uniform() * shapes.len() as f64) as usize).min(shapes.len() - 1);
        let checkpoint = (lo.ln() + uniform() * (hi.ln() - lo.ln())).exp().round() as Time;
        out.push(Job {
            arrival: t as Time,
            shape: shapes[i],
            checkpoint: checkpoint.max(1),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DLRM: &str = "instance_sn,app_name,gpu_request,creation_time,deletion_time\n\
        i0,app_a,1,,\n\
        i1,app_a,1,,100.0\n\
        i2,app_a,1,50.0,\n\
        i3,app_b,1,10,20\n\
        i4,app_c,0,10,20\n";

    #[test]
    fn services_are_instances_alive_over_time() {
        let s = parse_services(DLRM, "dlrm").unwrap();
        assert_eq!(s.len(), 2, "CPU-only services are left out");
        assert_eq!(s[0].steps, vec![(0, 2), (50_000, 3), (100_000, 2)]);
        assert_eq!(s[1].steps, vec![(0, 0), (10_000, 1), (20_000, 0)]);
        assert_eq!((s[0].at(60_000), s[0].peak(200_000)), (3, 3));
        assert!((s[1].mean(100_000) - 0.1).abs() < 1e-9);
    }

    #[test]
    fn bad_rows_are_refused_with_the_line() {
        let bad = "app_name,gpu_request,creation_time,deletion_time\na,1,20,10\n";
        let e = parse_services(bad, "f").unwrap_err().to_string();
        assert!(e.contains("f:2") && e.contains("deleted before"), "{e}");
        let e = parse_services("app_name,gpu_request\na,1\n", "f")
            .unwrap_err()
            .to_string();
        assert!(e.contains("creation_time"), "{e}");
    }

    #[test]
    fn tasks_are_best_effort_and_burstable_with_gpus() {
        let pods = "name,num_gpu,gpu_milli,qos,creation_time,deletion_time\n\
            a,1,220,BE,0,100\n\
            b,8,1000,Burstable,10,20\n\
            c,1,1000,LS,0,100\n\
            d,0,0,BE,0,100\n\
            e,1,500,BE,50,50\n";
        let t = parse_tasks(pods, "pods").unwrap();
        assert_eq!(
            t,
            vec![
                TaskShape {
                    num_gpu: 1,
                    gpu_milli: 220,
                    duration: 100_000,
                    models: None,
                },
                TaskShape {
                    num_gpu: 8,
                    gpu_milli: 1000,
                    duration: 10_000,
                    models: None,
                }
            ]
        );
    }

    #[test]
    fn gpu_spec_restricts_tasks_to_the_fleets_models() {
        let pods = "name,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time\n\
            any,1,220,,BE,0,100\n\
            t4,1,500,T4,BE,0,100\n\
            either,2,1000,P100|A100-40GB|T4,Burstable,0,100\n\
            none,1,300,V100M16,BE,0,100\n";
        let t = parse_tasks_on(pods, "pods", &["H100-80GB", "T4", "A100-40GB"]).unwrap();
        let models: Vec<Option<u64>> = t.shapes.iter().map(|s| s.models).collect();
        assert_eq!(models, vec![None, Some(0b010), Some(0b110)]);
        assert_eq!(t.left_out, 1);
        // Without the fleet's models (or the plain parser) gpu_spec is not read.
        assert!(parse_tasks(pods, "pods")
            .unwrap()
            .iter()
            .all(|s| s.models.is_none()));
        let only_t4 = "name,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time\n\
            t4,1,500,T4,BE,0,100\n";
        let err = parse_tasks_on(only_t4, "pods", &["B200"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("models the fleet lacks"), "{err}");
    }

    #[test]
    fn arrivals_offer_the_asked_load_and_repeat_by_seed() {
        let shapes = [TaskShape {
            num_gpu: 1,
            gpu_milli: 500,
            duration: 600_000,
            models: None,
        }];
        let a = Arrivals {
            offered_gpus: 100.0,
            until: 48 * 3_600_000,
            checkpoint: (300_000, 1_800_000),
            seed: 7,
        };
        let jobs = arrivals(&shapes, &a);
        // 100 GPUs of 0.5-GPU, 10-minute jobs: 1,200 an hour.
        let per_hour = jobs.len() as f64 / 48.0;
        assert!((per_hour - 1200.0).abs() < 60.0, "{per_hour}");
        assert!(jobs
            .iter()
            .all(|j| (300_000..=1_800_000).contains(&j.checkpoint)));
        assert_eq!(jobs, arrivals(&shapes, &a));
        assert_ne!(jobs, arrivals(&shapes, &Arrivals { seed: 8, ..a }));
    }

    const LLM: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
        2023-11-16 18:15:46.68,100,10\n\
        2023-11-16 18:16:10.00,200,20\n\
        2023-11-16 18:17:50.50,50,0\n\
        2023-11-16 18:18:50.00,1,1\n";

    #[test]
    fn llm_load_is_tokens_per_minute_the_cut_last_minute_left_out() {
        let m = parse_llm_tokens_per_minute(LLM, "llm").unwrap();
        // 18:15:46 starts minute 0: 110 then 220 (18:16:10 is 24 s later, same
        // minute), 50 in minute 2 (124 s); minute 3 (18:18:50) is the last, cut short by
        // the trace's end: dropped.
        assert_eq!(m, vec![330.0, 0.0, 50.0]);
        for (bad, why) in [
            ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 25:00:00,1,1\n", "TIMESTAMP"),
            ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 10:00:00,1,1\n2023-11-16 09:00:00,1,1\n", "time order"),
            ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 10:00:00,1,1\n2023-11-17 10:00:00,1,1\n", "one day"),
            ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 10:00:00,-5,1\n", "at least 0"),
            ("TIMESTAMP,ContextTokens\n2023-11-16 10:00:00,1\n", "GeneratedTokens"),
        ] {
            let e = parse_llm_tokens_per_minute(bad, "llm").unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn llm_demand_follows_the_day_and_peaks_at_the_asked_size() {
        assert!((diurnal(14 * 3_600_000, 0.2) - 1.0).abs() < 1e-9);
        assert!((diurnal(2 * 3_600_000, 0.2) - 0.2).abs() < 1e-9);
        let flat = vec![1000.0; 60];
        let day = 24 * 3_600_000;
        let s = llm_service("llm", &flat, 100, 0.2, 2 * day);
        assert_eq!(s.gpus, 1);
        assert_eq!(s.peak(2 * day), 100);
        assert_eq!(s.at(14 * 3_600_000), 100);
        assert_eq!(s.at(2 * 3_600_000), 20);
        assert_eq!(s.at(day + 2 * 3_600_000), 20, "the next day repeats");
        // Flat load under a raised cosine from 0.2 to 1: the mean is 0.6 of the peak.
        let mean = s.mean(2 * day);
        assert!((mean - 60.0).abs() < 1.5, "{mean}");
        // The trace's minutes show through the envelope.
        let bursty: Vec<f64> = (0..60)
            .map(|m| if m % 2 == 0 { 1000.0 } else { 500.0 })
            .collect();
        let b = llm_service("llm", &bursty, 100, 0.2, day);
        assert_eq!(b.at(14 * 3_600_000), 100);
        assert_eq!(b.at(14 * 3_600_000 + 60_000), 50);
        let none = azure_llm_services((LLM, "a"), (LLM, "b"), 0, 0.2, day).unwrap();
        assert!(none.is_empty());
        let two = azure_llm_services((LLM, "a"), (LLM, "b"), 7, 0.2, day).unwrap();
        assert_eq!(
            two.iter().map(|s| s.peak(day)).collect::<Vec<_>>(),
            vec![4, 3]
        );
    }
}
