//! The access keys the gateway accepts, read from a file the operator owns: one
//! `ACCESS_KEY SECRET_KEY` pair per line, `#` comments and blank lines ignored. The file
//! must not be readable by group or others, as ssh treats its private keys.

use std::collections::HashMap;
use std::path::Path;

use s3s::auth::{S3Auth, SecretKey};
use s3s::{s3_error, S3Result};

/// Access key → secret key.
#[derive(Clone)]
pub struct Keys(HashMap<String, SecretKey>);

impl std::fmt::Debug for Keys {
    // Never the secrets, not even in a test failure.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({} access keys)", self.0.len())
    }
}

#[async_trait::async_trait]
impl S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        // An unknown key is S3's InvalidAccessKeyId (s3s's SimpleAuth says NotSignedUp).
        self.0.get(access_key).cloned().ok_or_else(|| s3_error!(InvalidAccessKeyId))
    }
}

/// Parse and register the keys of `path`; errors name the file and line.
pub fn load(path: &Path) -> Result<Keys, String> {
    let text = alignfs::paths::read_private_file(path)?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse(text: &str) -> Result<Keys, String> {
    let mut keys = HashMap::new();
    let mut count = 0;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [access, secret] = fields[..] else {
            return Err(format!("line {}: expected `ACCESS_KEY SECRET_KEY`", number + 1));
        };
        if secret.len() < 8 {
            return Err(format!("line {}: the secret key of {access} is shorter than 8 characters", number + 1));
        }
        if keys.insert(access.to_string(), SecretKey::from(secret)).is_some() {
            return Err(format!("line {}: access key {access} appears twice", number + 1));
        }
        count += 1;
    }
    if count == 0 {
        return Err("holds no keys".into());
    }
    Ok(Keys(keys))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn keys_parse_with_comments_and_errors_name_the_line() {
        let auth = parse("# operators\nalice secret-one\n\n  bob   secret-two  \n").unwrap();
        assert_eq!(auth.0.get("alice").map(|k| k.expose().to_string()).as_deref(), Some("secret-one"));
        assert!(auth.0.contains_key("bob"));
        assert!(parse("alice\n").unwrap_err().contains("line 1"));
        assert!(parse("a secret-x\na secret-y\n").unwrap_err().contains("twice"));
        assert!(parse("a short\n").unwrap_err().contains("shorter"));
        assert!(parse("# nothing\n").unwrap_err().contains("no keys"));
    }

    #[test]
    fn a_key_file_others_can_read_is_refused() {
        let dir = std::env::temp_dir().join(format!("alignfs-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("keys");
        std::fs::write(&path, "alice secret-one\n").unwrap_or_default();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap_or_default();
        assert!(load(&path).err().unwrap_or_default().contains("chmod 600"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap_or_default();
        assert!(load(&path).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
