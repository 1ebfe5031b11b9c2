//! The checkpoint's intent log (`checkpoint.log`): each commit's changes to the prepared
//! claims become one small record written in place into a preallocated file, so a prepare
//! costs a `pwrite` (and an `fdatasync` for a durable record) instead of rewriting and
//! renaming the whole checkpoint.
//!
//! Layout: a fixed-length header line, the records, then one NUL byte that marks the end
//! (the next record overwrites it). Every line is
//! `<epoch: 16 hex> <crc32 of "<epoch> <json>": 8 hex> <json>\n`. The header's JSON names
//! the format and its version; a record's JSON holds one commit's changes,
//! `{"ops":[{"put":{"uid":…,"claim":{…}}},{"delete":"<uid>"},{"bootId":"…"}]}`.
//!
//! The file is zero-filled to [`SIZE`] when it is created and then only overwritten, so an
//! `fdatasync` of a record flushes data blocks only (no size or block-allocation change to
//! journal). It is reused after a compaction: the header is rewritten with a new epoch and
//! records of an older epoch behind it end the log. The log applies to the snapshot
//! (`checkpoint.json`) whose `data.logEpoch` equals the header's epoch (see
//! [`super::Session::settle`] for the order of a compaction's writes).
//!
//! Reading ([`parse`]) stops at the first line that is not a whole record of the header's
//! epoch: a NUL (the end marker, or never-written space), a record of an older epoch, or a
//! torn record (a crash during its write: cut short, NUL inside, checksum mismatch), which
//! is ignored. A damaged record followed by a good record of the same epoch is reported as
//! corruption instead: the caller rebuilds the checkpoint.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Data, PreparedClaim};

/// The log's file name, next to `checkpoint.json`.
pub const FILE_NAME: &str = "checkpoint.log";

/// Preallocated size of a new log: about a thousand prepare/unprepare pairs between
/// compactions.
pub const SIZE: u64 = 1 << 20;

/// The header's JSON: a reader accepts only the log versions it knows.
const FORMAT: &str = r#"{"format":"tessera.io/dra-checkpoint-log","version":1}"#;

/// Bytes before a line's JSON: epoch, space, checksum, space.
const PREFIX: usize = 16 + 1 + 8 + 1;

/// Length of the header line.
pub const HEADER_LEN: u64 = (PREFIX + FORMAT.len() + 1) as u64;

/// One change to the checkpoint's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Op {
    /// The claim's record is now this one.
    Put { uid: String, claim: PreparedClaim },
    /// The claim has no record.
    Delete(String),
    /// The boot ID.
    BootId(String),
}

#[derive(Serialize)]
struct RecordOut<'a> {
    ops: &'a [Op],
}

#[derive(Deserialize)]
struct RecordIn {
    ops: Vec<Op>,
}

#[derive(Deserialize)]
struct Header {
    format: String,
    version: u32,
}

fn line(epoch: u64, json: &[u8]) -> Vec<u8> {
    let epoch = format!("{epoch:016x}");
    let mut crc = crc32fast::Hasher::new();
    crc.update(epoch.as_bytes());
    crc.update(b" ");
    crc.update(json);
    let mut out = Vec::with_capacity(PREFIX + json.len() + 1);
    out.extend_from_slice(epoch.as_bytes());
    out.push(b' ');
    out.extend_from_slice(format!("{:08x}", crc.finalize()).as_bytes());
    out.push(b' ');
    out.extend_from_slice(json);
    out.push(b'\n');
    out
}

/// The header line of a log of `epoch`.
pub fn header(epoch: u64) -> Vec<u8> {
    line(epoch, FORMAT.as_bytes())
}

/// The record line of `ops` in a log of `epoch`.
pub fn record(epoch: u64, ops: &[Op]) -> serde_json::Result<Vec<u8>> {
    Ok(line(epoch, &serde_json::to_vec(&RecordOut { ops })?))
}

/// A line (without its `\n`) whose checksum holds: its epoch and JSON.
fn check_line(line: &[u8]) -> Option<(u64, &[u8])> {
    if line.len() < PREFIX || line.contains(&0) {
        return None;
    }
    let text = |r: std::ops::Range<usize>| std::str::from_utf8(&line[r]).ok();
    let epoch = u64::from_str_radix(text(0..16)?, 16).ok()?;
    let sum = u32::from_str_radix(text(17..25)?, 16).ok()?;
    if line[16] != b' ' || line[25] != b' ' {
        return None;
    }
    let json = &line[PREFIX..];
    let mut crc = crc32fast::Hasher::new();
    crc.update(&line[..17]);
    crc.update(json);
    (crc.finalize() == sum).then_some((epoch, json))
}

/// The line starting at `pos` (without its `\n`) and where the next one starts; `None`
/// when no `\n` ends it.
fn line_at(bytes: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = bytes.get(pos..)?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    Some((&rest[..nl], pos + nl + 1))
}

/// What a log holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// The header's epoch; 0 when there is no valid header (a new, torn or foreign file):
    /// then the log holds nothing.
    pub epoch: u64,
    /// The records' changes, in order.
    pub ops: Vec<Op>,
    /// Where the next record goes (the end marker's offset).
    pub end: u64,
    /// A torn record (or header) was ignored at `end`.
    pub torn: bool,
}

/// Read a log's bytes. `Err` (the reason) for a damaged record that good records of the
/// same epoch follow, or a log version this release cannot read.
pub fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let header = line_at(bytes, 0).and_then(|(l, next)| Some((check_line(l)?, next)));
    let Some(((epoch, json), mut pos)) = header else {
        // Never written, or a header torn while it was rewritten (which happens only after
        // the snapshot holding everything was made durable): nothing to apply.
        let torn = bytes.first().is_some_and(|&b| b != 0);
        return Ok(Parsed {
            torn,
            ..Parsed::default()
        });
    };
    let head: Header =
        serde_json::from_slice(json).map_err(|e| format!("header is not a log header: {e}"))?;
    if head.format != "tessera.io/dra-checkpoint-log" || head.version != 1 {
        return Err(format!(
            "log format {} version {} is not readable by this release (reads version 1)",
            head.format, head.version
        ));
    }
    let mut ops = Vec::new();
    loop {
        if bytes.get(pos).is_none_or(|&b| b == 0) {
            return Ok(Parsed {
                epoch,
                ops,
                end: pos as u64,
                torn: false,
            });
        }
        let good = line_at(bytes, pos).and_then(|(l, next)| {
            let (e, json) = check_line(l)?;
            Some((e, json, next))
        });
        match good {
            Some((e, json, next)) if e == epoch => {
                match serde_json::from_slice::<RecordIn>(json) {
                    Ok(r) => {
                        ops.extend(r.ops);
                        pos = next;
                        continue;
                    }
                    // Checksum good, content not: written by something else than a
                    // reader of this version, never torn.
                    Err(e) => return Err(format!("record at byte {pos}: {e}")),
                }
            }
            // A record of an older epoch: the log reused after a compaction ends here.
            Some(_) => {
                return Ok(Parsed {
                    epoch,
                    ops,
                    end: pos as u64,
                    torn: false,
                })
            }
            None => {}
        }
        // Damaged. A crash tears only the last record written; good records after it mean
        // the file was damaged otherwise.
        let mut next = line_at(bytes, pos).map(|(_, n)| n);
        while let Some(at) = next {
            let Some((l, after)) = line_at(bytes, at) else {
                break;
            };
            if check_line(l).is_some_and(|(e, _)| e == epoch) {
                return Err(format!(
                    "record at byte {pos} is damaged and a record at byte {at} follows it"
                ));
            }
            next = Some(after);
        }
        return Ok(Parsed {
            epoch,
            ops,
            end: pos as u64,
            torn: true,
        });
    }
}

/// Apply `ops` to `data`, in order.
pub fn apply(data: &mut Data, ops: impl IntoIterator<Item = Op>) {
    for op in ops {
        match op {
            Op::Put { uid, claim } => {
                data.claims.insert(uid, claim);
            }
            Op::Delete(uid) => {
                data.claims.remove(&uid);
            }
            Op::BootId(id) => data.boot_id = id,
        }
    }
}

/// The changes that turn `old` into `new`. Pure.
pub fn diff(old: &Data, new: &Data) -> Vec<Op> {
    let mut ops = Vec::new();
    if old.boot_id != new.boot_id {
        ops.push(Op::BootId(new.boot_id.clone()));
    }
    for (uid, claim) in &new.claims {
        if old.claims.get(uid) != Some(claim) {
            ops.push(Op::Put {
                uid: uid.clone(),
                claim: claim.clone(),
            });
        }
    }
    for uid in old.claims.keys() {
        if !new.claims.contains_key(uid) {
            ops.push(Op::Delete(uid.clone()));
        }
    }
    ops
}

/// The open log this process appends to.
#[derive(Debug)]
pub struct LogFile {
    file: Arc<File>,
    epoch: u64,
    end: u64,
    len: u64,
}

/// Where the log ends as this process last wrote or read it: a record of `epoch` at `end`
/// means another writer appended since.
#[derive(Debug, Clone)]
pub struct Tail {
    file: Arc<File>,
    epoch: u64,
    end: u64,
}

impl Tail {
    /// No record of this epoch was written at the end since (one `pread`).
    pub fn unchanged(&self) -> bool {
        let mut buf = [0u8; 16];
        match self.file.read_at(&mut buf, self.end) {
            Ok(16) => buf != *format!("{:016x}", self.epoch).as_bytes(),
            Ok(_) => true,
            Err(_) => false,
        }
    }
}

impl LogFile {
    /// A log found on disk (`parsed` from its bytes), to append to after `end`.
    pub fn found(file: File, parsed: &Parsed) -> std::io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(Self {
            file: Arc::new(file),
            epoch: parsed.epoch,
            end: parsed.end,
            len,
        })
    }

    /// Create a zero-filled log of [`SIZE`] with the header of `epoch` in `dir`: written
    /// as a new temporary file ([`crate::fsio::Replace`]: a unique name a planted symlink
    /// cannot redirect), fsynced, renamed into place, directory fsynced.
    pub fn create(dir: &Path, epoch: u64) -> std::io::Result<Self> {
        let mut first = header(epoch);
        let end = first.len() as u64;
        first.resize(64 * 1024, 0);
        let file =
            crate::fsio::Replace::durable(0o600).write_with(&dir.join(FILE_NAME), |file| {
                file.write_all(&first)?;
                let zeros = vec![0u8; 64 * 1024];
                for _ in 1..SIZE / zeros.len() as u64 {
                    file.write_all(&zeros)?;
                }
                Ok(())
            })?;
        Ok(Self {
            file: Arc::new(file),
            epoch,
            end,
            len: SIZE,
        })
    }

    /// Empty the log for `epoch`: rewrite the header (and the end marker after it) in
    /// place, `fdatasync`. False when the file is too small to be reused.
    pub fn reset(&mut self, epoch: u64) -> std::io::Result<bool> {
        if self.len < SIZE / 2 {
            return Ok(false);
        }
        let mut bytes = header(epoch);
        bytes.push(0);
        self.file.write_all_at(&bytes, 0)?;
        self.file.sync_data()?;
        self.epoch = epoch;
        self.end = HEADER_LEN;
        Ok(true)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether a record of `n` bytes (and the end marker) still fits.
    pub fn fits(&self, n: usize) -> bool {
        self.end + (n as u64) < self.len
    }

    /// No record since the header.
    pub fn is_empty(&self) -> bool {
        self.end <= HEADER_LEN
    }

    /// Write `record` (from [`record`] with this log's epoch) and the end marker at the
    /// end, in one `pwrite`; `fdatasync` when `sync`.
    pub fn append(&mut self, record: &[u8], sync: bool) -> std::io::Result<()> {
        let mut bytes = Vec::with_capacity(record.len() + 1);
        bytes.extend_from_slice(record);
        bytes.push(0);
        self.file.write_all_at(&bytes, self.end)?;
        self.end += record.len() as u64;
        if sync {
            self.sync()?;
        }
        Ok(())
    }

    /// `fdatasync`: the records written so far are durable.
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    pub fn tail(&self) -> Tail {
        Tail {
            file: self.file.clone(),
            epoch: self.epoch,
            end: self.end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::checkpoint::Phase;

    fn claim(name: &str, phase: Phase) -> PreparedClaim {
        PreparedClaim {
            namespace: "ml".into(),
            name: name.into(),
            phase,
            devices: Vec::new(),
        }
    }

    fn put(uid: &str, phase: Phase) -> Op {
        Op::Put {
            uid: uid.into(),
            claim: claim(uid, phase),
        }
    }

    /// A log of epoch 7 with three records, each followed by its offset.
    fn log() -> (Vec<u8>, Vec<usize>) {
        let mut bytes = header(7);
        let mut ends = Vec::new();
        for ops in [
            vec![Op::BootId("boot-1".into()), put("a", Phase::Started)],
            vec![put("a", Phase::Completed)],
            vec![put("b", Phase::Started), Op::Delete("a".into())],
        ] {
            bytes.extend(record(7, &ops).unwrap());
            ends.push(bytes.len());
        }
        bytes.push(0);
        bytes.resize(4096, 0);
        (bytes, ends)
    }

    #[test]
    fn records_are_read_back_in_order_and_applied() {
        let (bytes, ends) = log();
        let p = parse(&bytes).unwrap();
        assert_eq!((p.epoch, p.end, p.torn), (7, ends[2] as u64, false));
        assert_eq!(p.ops.len(), 5);
        let mut data = Data::default();
        apply(&mut data, p.ops);
        assert_eq!(data.boot_id, "boot-1");
        assert_eq!(data.claims.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(HEADER_LEN as usize, header(7).len());
    }

    #[test]
    fn damaged_logs_table() {
        let (bytes, ends) = log();
        let last = ends[1]..ends[2];
        let middle = ends[0]..ends[1];
        // (case, bytes, want: Ok((records' ops kept, torn)) or Err(substring))
        type Case = (&'static str, Vec<u8>, Result<(usize, bool), &'static str>);
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = bytes.clone();
            f(&mut b);
            b
        };
        let cases: Vec<Case> = vec![
            ("intact", bytes.clone(), Ok((5, false))),
            (
                "last record cut short (zeros after half of it)",
                with(&|b| b[last.start + 20..].fill(0)),
                Ok((3, true)),
            ),
            (
                "last record with a sector never written (zeros inside)",
                with(&|b| b[last.start + 30..last.start + 40].fill(0)),
                Ok((3, true)),
            ),
            (
                "last record with a flipped byte",
                with(&|b| b[last.end - 5] ^= 1),
                Ok((3, true)),
            ),
            (
                "end marker lost: old bytes after the last record",
                with(&|b| b[ends[2]..ends[2] + 10].copy_from_slice(b"deadbeef00")),
                Ok((5, true)),
            ),
            (
                "a middle record with a flipped byte, a good record after it",
                with(&|b| b[middle.end - 5] ^= 1),
                Err("is damaged and a record at byte"),
            ),
            (
                "torn header: nothing to apply",
                with(&|b| b[3] = 0),
                Ok((0, true)),
            ),
            ("never written", vec![0; 4096], Ok((0, false))),
            ("empty file", vec![], Ok((0, false))),
            (
                "a newer log version",
                {
                    let mut b = line(
                        7,
                        br#"{"format":"tessera.io/dra-checkpoint-log","version":2}"#,
                    );
                    b.push(0);
                    b
                },
                Err("version 2 is not readable"),
            ),
        ];
        for (case, bytes, want) in cases {
            match (parse(&bytes), want) {
                (Ok(p), Ok((ops, torn))) => {
                    assert_eq!((p.ops.len(), p.torn), (ops, torn), "{case}");
                }
                (Err(e), Err(want)) => assert!(e.contains(want), "{case}: {e}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_reused_log_ends_at_records_of_an_older_epoch() {
        let (mut bytes, _) = log();
        // Compaction: the header is rewritten for epoch 8 with its end marker; the old
        // records stay behind it.
        let mut h = header(8);
        h.push(0);
        bytes[..h.len()].copy_from_slice(&h);
        let p = parse(&bytes).unwrap();
        assert_eq!((p.epoch, p.ops.len(), p.torn), (8, 0, false));
        // A new record overwrites the marker and part of an old record; its own marker
        // ends the log again.
        let mut r = record(8, &[put("c", Phase::Completed)]).unwrap();
        r.push(0);
        bytes[HEADER_LEN as usize..HEADER_LEN as usize + r.len()].copy_from_slice(&r);
        let p = parse(&bytes).unwrap();
        assert_eq!((p.ops.len(), p.torn), (1, false));
        // Without the marker, the old epoch's leftovers still end it, as a torn tail.
        let at = HEADER_LEN as usize + r.len() - 1;
        bytes[at] = b'x';
        let p = parse(&bytes).unwrap();
        assert_eq!((p.ops.len(), p.end as usize), (1, at));
    }

    #[test]
    fn diff_then_apply_gives_the_new_content() {
        let mut old = Data {
            boot_id: "b1".into(),
            ..Data::default()
        };
        old.claims.insert("a".into(), claim("a", Phase::Completed));
        old.claims.insert("b".into(), claim("b", Phase::Started));
        let mut new = old.clone();
        new.boot_id = "b2".into();
        new.claims.remove("a");
        new.claims.get_mut("b").unwrap().phase = Phase::Completed;
        new.claims.insert("c".into(), claim("c", Phase::Started));
        let ops = diff(&old, &new);
        assert_eq!(ops.len(), 4);
        let mut got = old.clone();
        apply(&mut got, ops);
        assert_eq!(got, new);
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn files_are_created_reset_and_appended_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = LogFile::create(dir.path(), 3).unwrap();
        let path = dir.path().join(FILE_NAME);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), SIZE);
        let tail = log.tail();
        assert!(tail.unchanged());
        let r = record(3, &[put("a", Phase::Started)]).unwrap();
        log.append(&r, false).unwrap();
        assert!(!tail.unchanged(), "a record after the old end is seen");
        assert!(log.tail().unchanged());
        log.append(&record(3, &[put("a", Phase::Completed)]).unwrap(), true)
            .unwrap();
        let p = parse(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!((p.epoch, p.ops.len(), p.end), (3, 2, log.end));
        assert!(log.reset(4).unwrap());
        assert!(log.is_empty());
        let p = parse(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!((p.epoch, p.ops.len()), (4, 0));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), SIZE, "size kept");
    }
}
