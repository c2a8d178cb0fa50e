//! Tenants' uploaded files: metadata and text in one row. Every read and
//! delete is by account and id together, so another account's file is not
//! found, exactly as an unknown id is not.

use super::{Conn, get_time, get_u64, to_i64};
use crate::Error;
use bulkhead_control_api::{
    FileUpload, FileView, MAX_FILE_BYTES, MAX_FILE_BYTES_PER_ACCOUNT, MAX_FILE_LINES,
    MAX_FILES_PER_ACCOUNT, Timestamp,
};
use sqlx::Row;
use sqlx::any::AnyRow;

/// The purposes a file may be uploaded for.
pub const PURPOSES: &[&str] = &["batch"];
/// The longest file name, in bytes.
pub const MAX_FILENAME: usize = 256;

select_macro!(
    $ select_files,
    "id, account_id, purpose, filename, bytes, lines, created_at",
    "files"
);

/// Stores `upload` as a new file, within the account's quota of files
/// and bytes (the caller's transaction holds the count and the insert
/// together).
pub async fn create(
    conn: &mut Conn,
    upload: &FileUpload,
    now: Timestamp,
) -> Result<FileView, Error> {
    if crate::AccountId::parse(&upload.account_id).is_none() {
        return Err(Error::Invalid("account_id is 32 hex digits".to_owned()));
    }
    if !PURPOSES.contains(&upload.purpose.as_str()) {
        return Err(Error::Invalid(format!(
            "purpose must be one of {}",
            PURPOSES.join(", ")
        )));
    }
    super::require_text("filename", &upload.filename, MAX_FILENAME)?;
    if upload.filename.chars().any(char::is_control) {
        return Err(Error::Invalid(
            "filename must not hold control characters".to_owned(),
        ));
    }
    let view = FileView {
        id: new_id()?,
        account_id: upload.account_id.clone(),
        purpose: upload.purpose.clone(),
        filename: upload.filename.clone(),
        bytes: upload.content.len() as u64,
        lines: check_content(&upload.content)?,
        created_at: now,
    };
    let kept = sqlx::query(
        "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(bytes), 0) AS BIGINT) AS total \
         FROM files WHERE account_id = $1",
    )
    .bind(view.account_id.as_str())
    .fetch_one(&mut *conn)
    .await?;
    let (n, total) = (get_u64(&kept, "n")?, get_u64(&kept, "total")?);
    if n >= MAX_FILES_PER_ACCOUNT || total + view.bytes > MAX_FILE_BYTES_PER_ACCOUNT {
        return Err(Error::Invalid(format!(
            "an account keeps at most {MAX_FILES_PER_ACCOUNT} files and {MAX_FILE_BYTES_PER_ACCOUNT} bytes \
             of them ({n} files, {total} bytes now): delete some first"
        )));
    }
    insert(conn, &view, &upload.content).await?;
    Ok(view)
}

/// Stores a batch's output for `account` (purpose `batch_output`): written
/// by the control plane itself, so outside the upload bounds and the
/// account's quota (a batch's answers are never refused for their size;
/// they are bounded by its lines and each answer's length).
pub async fn insert_output(
    conn: &mut Conn,
    account: &str,
    filename: &str,
    content: &str,
    now: Timestamp,
) -> Result<FileView, Error> {
    let view = FileView {
        id: new_id()?,
        account_id: account.to_owned(),
        purpose: "batch_output".to_owned(),
        filename: filename.to_owned(),
        bytes: content.len() as u64,
        lines: content.lines().count() as u64,
        created_at: now,
    };
    insert(conn, &view, content).await?;
    Ok(view)
}

async fn insert(conn: &mut Conn, view: &FileView, content: &str) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO files (id, account_id, purpose, filename, bytes, lines, created_at, content) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(view.id.as_str())
    .bind(view.account_id.as_str())
    .bind(view.purpose.as_str())
    .bind(view.filename.as_str())
    .bind(to_i64(view.bytes, "bytes")?)
    .bind(to_i64(view.lines, "lines")?)
    .bind(view.created_at.millis())
    .bind(content)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The bounds every file's text keeps: its size, its lines, no NUL (no
/// JSON text holds one, and PostgreSQL's `TEXT` cannot); its line count.
pub fn check_content(content: &str) -> Result<u64, Error> {
    if content.len() > MAX_FILE_BYTES {
        return Err(Error::Invalid(format!(
            "a file is at most {MAX_FILE_BYTES} bytes, not {}",
            content.len()
        )));
    }
    if content.contains('\0') {
        return Err(Error::Invalid(
            "a file must not hold NUL characters".to_owned(),
        ));
    }
    let lines = content.lines().filter(|l| !l.trim().is_empty()).count();
    if lines == 0 || lines > MAX_FILE_LINES {
        return Err(Error::Invalid(format!(
            "a file holds 1 to {MAX_FILE_LINES} lines, not {lines}"
        )));
    }
    Ok(lines as u64)
}

/// One of `account`'s files.
pub async fn get(conn: &mut Conn, account: &str, id: &str) -> Result<FileView, Error> {
    let q = sqlx::query(select_files!("WHERE id = $1 AND account_id = $2"));
    super::one(conn, q.bind(id).bind(account), view, || {
        format!("file {id}")
    })
    .await
}

/// One of `account`'s files' text.
pub async fn content(conn: &mut Conn, account: &str, id: &str) -> Result<String, Error> {
    let q = sqlx::query("SELECT content FROM files WHERE id = $1 AND account_id = $2");
    super::one(
        conn,
        q.bind(id).bind(account),
        |r| Ok(r.try_get("content")?),
        || format!("file {id}"),
    )
    .await
}

/// `account`'s files, newest first.
pub async fn list(conn: &mut Conn, account: &str) -> Result<Vec<FileView>, Error> {
    let q = sqlx::query(select_files!(
        "WHERE account_id = $1 ORDER BY created_at DESC, id"
    ));
    super::all(conn, q.bind(account), view).await
}

/// Deletes one of `account`'s files.
pub async fn delete(conn: &mut Conn, account: &str, id: &str) -> Result<(), Error> {
    let q = sqlx::query("DELETE FROM files WHERE id = $1 AND account_id = $2");
    super::change(conn, q.bind(id).bind(account), || format!("file {id}")).await
}

fn new_id() -> Result<String, Error> {
    let mut b = [0u8; 12];
    getrandom::fill(&mut b).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
    Ok(format!("file-{}", crate::ids::hex(&b)))
}

fn view(r: &AnyRow) -> Result<FileView, Error> {
    Ok(FileView {
        id: r.try_get("id")?,
        account_id: r.try_get("account_id")?,
        purpose: r.try_get("purpose")?,
        filename: r.try_get("filename")?,
        bytes: get_u64(r, "bytes")?,
        lines: get_u64(r, "lines")?,
        created_at: get_time(r, "created_at")?,
    })
}
