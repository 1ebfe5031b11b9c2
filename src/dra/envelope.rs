//! The envelope of the node's state files (the DRA checkpoint's snapshot, the agent's
//! split record): one line of JSON `{"version": V, "checksum": "<crc32>", "data": {…}}`.
//!
//! `data` is written in its canonical encoding (serde_json's `Value` keeps object keys
//! sorted), which the CRC32 covers. `version` is `100 × major + minor`: a reader accepts
//! any version of the major it knows (a minor bump only adds fields, which older readers
//! ignore), so older and newer releases read each other's files. Pure.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub(crate) struct Envelope {
    pub version: u32,
    pub checksum: String,
    pub data: serde_json::Value,
}

/// The checksum of `data`'s canonical encoding.
pub(crate) fn checksum(data: &serde_json::Value) -> Result<String, serde_json::Error> {
    Ok(format!(
        "{:08x}",
        crc32fast::hash(&serde_json::to_vec(data)?)
    ))
}

/// The file content for `data` at format `version` (`data` is serialised once, not again
/// for the file; `jq .` shows it indented).
pub(crate) fn seal(version: u32, data: &serde_json::Value) -> Result<Vec<u8>, serde_json::Error> {
    let canonical = serde_json::to_vec(data)?;
    let sum = crc32fast::hash(&canonical);
    let mut body = format!(r#"{{"version":{version},"checksum":"{sum:08x}","data":"#).into_bytes();
    body.reserve(canonical.len() + 2);
    body.extend_from_slice(&canonical);
    body.extend_from_slice(b"}\n");
    Ok(body)
}

/// The checked `data` of a file written by [`seal`] for a reader of format `version`;
/// otherwise why it cannot be read (`what` names the kind of file in the reason).
pub(crate) fn open(version: u32, what: &str, bytes: &[u8]) -> Result<serde_json::Value, String> {
    let env: Envelope = serde_json::from_slice(bytes).map_err(|e| format!("not a {what}: {e}"))?;
    if env.version / 100 != version / 100 || env.version == 0 {
        return Err(format!(
            "format version {} is not readable by this release (reads {version})",
            env.version
        ));
    }
    let sum = checksum(&env.data).map_err(|e| e.to_string())?;
    if sum != env.checksum {
        return Err(format!(
            "checksum {} does not match the content ({sum})",
            env.checksum
        ));
    }
    Ok(env.data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_data_opens_and_damage_is_named() {
        let data = serde_json::json!({"b": [1, 2], "a": "x"});
        let body = seal(3, &data).unwrap();
        assert_eq!(open(3, "record", &body).unwrap(), data);
        assert_eq!(open(99, "record", &body).unwrap(), data, "same major 0");
        let text = String::from_utf8(body).unwrap();
        let err = open(3, "record", text.replace("\"x\"", "\"y\"").as_bytes()).unwrap_err();
        assert!(err.starts_with("checksum "), "{err}");
        let err = open(
            3,
            "record",
            text.replace("\"version\":3", "\"version\":103").as_bytes(),
        )
        .unwrap_err();
        assert!(err.contains("format version 103"), "{err}");
        let err = open(3, "record", b"{").unwrap_err();
        assert!(err.starts_with("not a record: "), "{err}");
    }
}
