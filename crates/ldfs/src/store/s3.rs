//! An S3 bucket as an [`ObjectStore`].
//!
//! Requests are built and signed (SigV4, presigned: the signature travels in the query string,
//! so bodies need no hashing) by `rusty-s3`, and sent by `ureq`, a blocking HTTP client: the
//! layer above runs on plain threads and needs no async runtime. Path-style URLs
//! (`ENDPOINT/BUCKET/KEY`) when an endpoint is given, as Ceph's radosgw and most S3-compatible
//! stores want without wildcard DNS.
//!
//! Configuration is read the way S3 tools read it, from the environment, never from a command
//! line where `ps` would show it: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` (optional), `AWS_REGION` or
//! `AWS_DEFAULT_REGION` (default `us-east-1`).

use std::time::Duration;

use rusty_s3::actions::ListObjectsV2;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

use super::{ObjectInfo, ObjectStore, PutOutcome, StoreError, StoreOp, StoreResult};

/// How long a presigned request stays valid: only from signing to sending, so short.
const SIGNED_FOR: Duration = Duration::from_secs(600);
/// The largest object a get reads (a segment is at most 64 MiB; checkpoints are smaller).
const MAX_OBJECT_BYTES: u64 = 1 << 30;
/// A listing page (S3's maximum).
const LIST_PAGE_KEYS: usize = 1000;

/// Where a bucket is and how to reach it.
#[derive(Clone)]
pub struct S3Config {
    /// `http://host:port` or `https://...`; `None` = AWS's regional endpoint.
    pub endpoint: Option<String>,
    pub region: String,
    pub bucket: String,
    /// Prepended to every key (`PREFIX/`), so one bucket can hold several file systems.
    pub prefix: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Per request, connection included.
    pub timeout: Duration,
}

impl std::fmt::Debug for S3Config {
    // Never print the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl S3Config {
    /// Bucket and prefix as given (`s3://BUCKET/PREFIX` parsed by the caller), the rest from
    /// the environment.
    pub fn from_env(bucket: &str, prefix: &str) -> StoreResult<S3Config> {
        Self::from_vars(bucket, prefix, |k| std::env::var(k).ok())
    }

    /// As `from_env`, with the variables looked up by `var` (tests read an env file).
    ///
    /// Without `AWS_ACCESS_KEY_ID` in the environment the keys come from the shared
    /// credentials file (`AWS_SHARED_CREDENTIALS_FILE`, default `~/.aws/credentials`), profile
    /// `AWS_PROFILE` (default `default`); the region and endpoint not set in the environment
    /// from the shared config file (`AWS_CONFIG_FILE`, default `~/.aws/config`: `region`,
    /// `endpoint_url`), as the AWS CLI reads them.
    pub fn from_vars(
        bucket: &str,
        prefix: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> StoreResult<S3Config> {
        let var = |k: &str| var(k).filter(|v| !v.is_empty());
        let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".to_string());
        let home = var("HOME").unwrap_or_default();
        let config = var("AWS_CONFIG_FILE").unwrap_or_else(|| format!("{home}/.aws/config"));
        // The config file names profiles `[profile NAME]`, except `[default]`.
        let config_section = if profile == "default" {
            profile.clone()
        } else {
            format!("profile {profile}")
        };
        let from_config = |k: &str| ini_value(&config, &config_section, k);
        let (access_key_id, secret_access_key, session_token) = match var("AWS_ACCESS_KEY_ID") {
            Some(id) => (
                id,
                var("AWS_SECRET_ACCESS_KEY").ok_or_else(|| {
                    StoreError::Config(
                        "AWS_ACCESS_KEY_ID is set, AWS_SECRET_ACCESS_KEY is not".into(),
                    )
                })?,
                var("AWS_SESSION_TOKEN"),
            ),
            None => {
                let file = var("AWS_SHARED_CREDENTIALS_FILE")
                    .unwrap_or_else(|| format!("{home}/.aws/credentials"));
                let get = |k: &str| ini_value(&file, &profile, k);
                match (get("aws_access_key_id"), get("aws_secret_access_key")) {
                    (Some(id), Some(secret)) => (id, secret, get("aws_session_token")),
                    _ => {
                        return Err(StoreError::Config(format!(
                            "no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not \
                             set, and {file} has no aws_access_key_id and \
                             aws_secret_access_key in [{profile}]"
                        )))
                    }
                }
            }
        };
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .or_else(|| from_config("region"))
            .unwrap_or_else(|| "us-east-1".to_string());
        Ok(S3Config {
            endpoint: var("AWS_ENDPOINT_URL").or_else(|| from_config("endpoint_url")),
            region,
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            access_key_id,
            secret_access_key,
            session_token,
            timeout: Duration::from_secs(120),
        })
    }
}

/// `key = value` in `[section]` of an INI file (the AWS shared files), if the file reads.
fn ini_value(path: &str, section: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == key {
                    return Some(v.trim().to_string()).filter(|v| !v.is_empty());
                }
            }
        }
    }
    None
}

/// See the module documentation.
pub struct S3Store {
    bucket: Bucket,
    credentials: Credentials,
    /// `PREFIX/`, or empty.
    prefix: String,
    agent: ureq::Agent,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Store({}/{})", self.bucket.base_url(), self.prefix)
    }
}

/// A request that got no HTTP answer: transient (no connection, a timeout,
/// a reset) unless retrying cannot help — a malformed request or URL, a
/// proxy setting, TLS that does not verify — which is final, so the
/// uploader reports it instead of retrying for ever (review 26).
fn unanswered(op: StoreOp, key: &str, e: ureq::Error) -> StoreError {
    let final_ = matches!(
        e,
        ureq::Error::Http(_)
            | ureq::Error::BadUri(_)
            | ureq::Error::InvalidProxyUrl
            | ureq::Error::Tls(_)
            | ureq::Error::Rustls(_)
            | ureq::Error::Pem(_)
    );
    if final_ {
        StoreError::Refused {
            op,
            key: key.to_string(),
            status: 0,
            detail: format!("no request could be made: {e}"),
        }
    } else {
        transient(op, key, e)
    }
}

fn transient(op: StoreOp, key: &str, reason: impl ToString) -> StoreError {
    StoreError::Unavailable {
        op,
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

impl S3Store {
    pub fn new(cfg: &S3Config) -> StoreResult<S3Store> {
        let (endpoint, style) = match &cfg.endpoint {
            Some(e) => (e.clone(), UrlStyle::Path),
            None => (
                format!("https://s3.{}.amazonaws.com", cfg.region),
                UrlStyle::VirtualHost,
            ),
        };
        let url = endpoint
            .parse()
            .map_err(|e| StoreError::Config(format!("endpoint {endpoint:?}: {e}")))?;
        let bucket = Bucket::new(url, style, cfg.bucket.clone(), cfg.region.clone())
            .map_err(|e| StoreError::Config(format!("bucket {:?}: {e}", cfg.bucket)))?;
        let credentials = match &cfg.session_token {
            Some(t) => Credentials::new_with_token(
                cfg.access_key_id.clone(),
                cfg.secret_access_key.clone(),
                t.clone(),
            ),
            None => Credentials::new(cfg.access_key_id.clone(), cfg.secret_access_key.clone()),
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(cfg.timeout))
            .timeout_connect(Some(Duration::from_secs(10)))
            .build()
            .into();
        Ok(S3Store {
            bucket,
            credentials,
            prefix: if cfg.prefix.is_empty() {
                String::new()
            } else {
                format!("{}/", cfg.prefix)
            },
            agent,
        })
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Create the bucket; `Ok` if it exists and is ours. (mkfs and the tests; the gateway
    /// makes its pools at the first one, which takes seconds on a fresh Ceph.)
    pub fn create_bucket(&self) -> StoreResult<()> {
        let url = self
            .bucket
            .create_bucket(&self.credentials)
            .sign(SIGNED_FOR);
        let op = StoreOp::CreateBucket;
        let name = self.bucket.name().to_string();
        let mut resp = self
            .agent
            .put(url.as_str())
            .send_empty()
            .map_err(|e| unanswered(op, &name, e))?;
        let status = resp.status().as_u16();
        match status {
            200 => Ok(()),
            409 => {
                let body = body_text(&mut resp);
                if body.contains("BucketAlreadyOwnedByYou") {
                    Ok(())
                } else {
                    Err(refused(op, &name, status, body))
                }
            }
            _ => Err(status_error(op, &name, status, body_text(&mut resp))),
        }
    }

    /// Delete the bucket, which must be empty; `Ok` if it is gone. (`ldfs bench fs` removes
    /// the bucket it made on a gateway it was given.)
    pub fn delete_bucket(&self) -> StoreResult<()> {
        let url = self
            .bucket
            .delete_bucket(&self.credentials)
            .sign(SIGNED_FOR);
        let op = StoreOp::DeleteBucket;
        let name = self.bucket.name().to_string();
        let mut resp = self
            .agent
            .delete(url.as_str())
            .call()
            .map_err(|e| unanswered(op, &name, e))?;
        match resp.status().as_u16() {
            200 | 204 | 404 => Ok(()),
            status => Err(status_error(op, &name, status, body_text(&mut resp))),
        }
    }

    fn put_inner(&self, op: StoreOp, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        let full = self.full(key);
        let mut action = self.bucket.put_object(Some(&self.credentials), &full);
        if op == StoreOp::PutIfAbsent {
            // Signed, so a proxy cannot strip it.
            action.headers_mut().insert("if-none-match", "*");
        }
        let url = action.sign(SIGNED_FOR);
        let mut req = self.agent.put(url.as_str());
        if op == StoreOp::PutIfAbsent {
            req = req.header("if-none-match", "*");
        }
        let mut resp = req.send(bytes).map_err(|e| unanswered(op, key, e))?;
        let status = resp.status().as_u16();
        match status {
            200 => Ok(PutOutcome::Created),
            412 if op == StoreOp::PutIfAbsent => Ok(PutOutcome::Exists),
            // S3: a conditional put raced another write to the key; try again.
            409 if op == StoreOp::PutIfAbsent => Err(transient(op, key, "409 conflict")),
            _ => Err(status_error(op, key, status, body_text(&mut resp))),
        }
    }
}

fn body_text(resp: &mut ureq::http::Response<ureq::Body>) -> String {
    let v = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024)
        .read_to_vec()
        .unwrap_or_default();
    let s = String::from_utf8_lossy(&v);
    // The S3 error code is what says why; keep it short.
    match (s.find("<Code>"), s.find("</Code>")) {
        (Some(a), Some(b)) if a + 6 <= b => s[a + 6..b].to_string(),
        _ => s.chars().take(200).collect(),
    }
}

fn refused(op: StoreOp, key: &str, status: u16, detail: String) -> StoreError {
    StoreError::Refused {
        op,
        key: key.to_string(),
        status,
        detail,
    }
}

/// 5xx (503 SlowDown included), 408 and 429 are worth retrying; other answers are final.
fn status_error(op: StoreOp, key: &str, status: u16, detail: String) -> StoreError {
    if status >= 500 || status == 408 || status == 429 {
        transient(op, key, format!("HTTP {status}: {detail}"))
    } else {
        refused(op, key, status, detail)
    }
}

impl ObjectStore for S3Store {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        self.put_inner(StoreOp::Put, key, bytes).map(|_| ())
    }

    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        self.put_inner(StoreOp::PutIfAbsent, key, bytes)
    }

    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        let op = StoreOp::Get;
        let full = self.full(key);
        let url = self
            .bucket
            .get_object(Some(&self.credentials), &full)
            .sign(SIGNED_FOR);
        let mut resp = self
            .agent
            .get(url.as_str())
            .call()
            .map_err(|e| unanswered(op, key, e))?;
        match resp.status().as_u16() {
            200 => resp
                .body_mut()
                .with_config()
                .limit(MAX_OBJECT_BYTES)
                .read_to_vec()
                .map_err(|e| unanswered(op, key, e)),
            404 => Err(StoreError::NotFound {
                key: key.to_string(),
            }),
            s => Err(status_error(op, key, s, body_text(&mut resp))),
        }
    }

    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        let op = StoreOp::GetRange;
        if len == 0 {
            return Ok(Vec::new());
        }
        let last = offset
            .checked_add(len - 1)
            .ok_or_else(|| StoreError::Config(format!("range {offset}+{len} overflows")))?;
        let full = self.full(key);
        let url = self
            .bucket
            .get_object(Some(&self.credentials), &full)
            .sign(SIGNED_FOR);
        let mut resp = self
            .agent
            .get(url.as_str())
            .header("range", format!("bytes={offset}-{last}"))
            .call()
            .map_err(|e| unanswered(op, key, e))?;
        let status = resp.status().as_u16();
        let body = match status {
            // 200: a store that ignores ranges sends everything.
            200 | 206 => resp
                .body_mut()
                .with_config()
                .limit(MAX_OBJECT_BYTES)
                .read_to_vec()
                .map_err(|e| unanswered(op, key, e))?,
            404 => {
                return Err(StoreError::NotFound {
                    key: key.to_string(),
                })
            }
            416 => {
                return Err(StoreError::BadAnswer {
                    op,
                    key: key.to_string(),
                    detail: format!("range {offset}+{len} not satisfiable"),
                })
            }
            s => return Err(status_error(op, key, s, body_text(&mut resp))),
        };
        let got = if status == 200 {
            let end = (offset + len).min(body.len() as u64);
            body.get(offset as usize..end as usize)
                .unwrap_or_default()
                .to_vec()
        } else {
            body
        };
        if got.len() as u64 != len {
            return Err(StoreError::BadAnswer {
                op,
                key: key.to_string(),
                detail: format!("asked {len} bytes at {offset}, got {}", got.len()),
            });
        }
        Ok(got)
    }

    fn delete(&self, key: &str) -> StoreResult<()> {
        let op = StoreOp::Delete;
        let full = self.full(key);
        let url = self
            .bucket
            .delete_object(Some(&self.credentials), &full)
            .sign(SIGNED_FOR);
        let mut resp = self
            .agent
            .delete(url.as_str())
            .call()
            .map_err(|e| unanswered(op, key, e))?;
        match resp.status().as_u16() {
            200 | 204 | 404 => Ok(()),
            s => Err(status_error(op, key, s, body_text(&mut resp))),
        }
    }

    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        let op = StoreOp::List;
        let full_prefix = self.full(prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut action: ListObjectsV2<'_> =
                self.bucket.list_objects_v2(Some(&self.credentials));
            action.with_prefix(full_prefix.as_str());
            action.with_max_keys(LIST_PAGE_KEYS);
            if let Some(t) = &token {
                action.with_continuation_token(t.as_str());
            }
            let url = action.sign(SIGNED_FOR);
            let mut resp = self
                .agent
                .get(url.as_str())
                .call()
                .map_err(|e| unanswered(op, prefix, e))?;
            let status = resp.status().as_u16();
            if status != 200 {
                return Err(status_error(op, prefix, status, body_text(&mut resp)));
            }
            let text = resp
                .body_mut()
                .with_config()
                .limit(64 << 20)
                .read_to_string()
                .map_err(|e| unanswered(op, prefix, e))?;
            let page = ListObjectsV2::parse_response(&text).map_err(|e| StoreError::BadAnswer {
                op,
                key: prefix.to_string(),
                detail: format!("listing does not parse: {e}"),
            })?;
            for c in page.contents {
                let Some(key) = c.key.strip_prefix(&self.prefix) else {
                    return Err(StoreError::BadAnswer {
                        op,
                        key: prefix.to_string(),
                        detail: format!("listed key {:?} outside the prefix", c.key),
                    });
                };
                out.push(ObjectInfo {
                    key: key.to_string(),
                    size_bytes: c.size.unwrap_or(0),
                });
            }
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review 26: an error retrying cannot cure (a bad URL, TLS that does
    /// not verify) is final; no connection or a timeout is transient.
    #[test]
    fn requests_that_cannot_be_made_are_final_and_lost_connections_transient() {
        for e in [
            ureq::Error::BadUri("no scheme".into()),
            ureq::Error::InvalidProxyUrl,
            ureq::Error::Tls("no certificate"),
        ] {
            let got = unanswered(StoreOp::Put, "seg/1", e);
            assert!(!got.is_transient(), "{got}");
        }
        for e in [ureq::Error::ConnectionFailed, ureq::Error::HostNotFound] {
            let got = unanswered(StoreOp::Put, "seg/1", e);
            assert!(got.is_transient(), "{got}");
        }
    }

    #[test]
    fn credentials_from_the_environment_or_the_shared_files() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        let conf = dir.path().join("config");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n\
             # a comment\n[work]\naws_access_key_id=WORK\naws_secret_access_key=worksecret\n\
             aws_session_token = tok\n",
        )
        .unwrap();
        std::fs::write(
            &conf,
            "[default]\nregion = eu-west-1\n[profile work]\nregion = ap-south-1\n\
             endpoint_url = http://127.0.0.1:7480\n",
        )
        .unwrap();
        let files = |extra: &'static [(&'static str, &'static str)]| {
            let creds = creds.display().to_string();
            let conf = conf.display().to_string();
            move |k: &str| -> Option<String> {
                match k {
                    "AWS_SHARED_CREDENTIALS_FILE" => Some(creds.clone()),
                    "AWS_CONFIG_FILE" => Some(conf.clone()),
                    _ => extra
                        .iter()
                        .find(|(n, _)| *n == k)
                        .map(|(_, v)| v.to_string()),
                }
            }
        };
        let c = S3Config::from_vars("b", "/p/", files(&[])).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.secret_access_key.as_str()),
            ("DEF", "defsecret")
        );
        assert_eq!(
            (c.region.as_str(), c.endpoint, c.prefix.as_str()),
            ("eu-west-1", None, "p")
        );
        let c = S3Config::from_vars("b", "", files(&[("AWS_PROFILE", "work")])).unwrap();
        assert_eq!(c.access_key_id, "WORK");
        assert_eq!(c.session_token.as_deref(), Some("tok"));
        assert_eq!(c.region, "ap-south-1");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:7480"));
        // The environment wins over the files.
        let c = S3Config::from_vars(
            "b",
            "",
            files(&[
                ("AWS_ACCESS_KEY_ID", "ENV"),
                ("AWS_SECRET_ACCESS_KEY", "envsecret"),
                ("AWS_REGION", "us-west-2"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.region.as_str()),
            ("ENV", "us-west-2")
        );
        // A profile the file lacks is a clear error naming it.
        let e = S3Config::from_vars("b", "", files(&[("AWS_PROFILE", "none")])).unwrap_err();
        assert!(e.to_string().contains("[none]"), "{e}");
        // An id without its secret too.
        let e = S3Config::from_vars("b", "", files(&[("AWS_ACCESS_KEY_ID", "X")])).unwrap_err();
        assert!(e.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{e}");
    }
}
