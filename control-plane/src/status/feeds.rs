//! The incident history as Atom and RSS 2.0, in the shape of Statuspage's
//! `/history.atom` and `/history.rss`: one entry per incident, newest first,
//! whose HTML content lists the updates newest first, each as
//! `<p><small>date</small><br><strong>Status</strong> - body</p>`, after the
//! postmortem when one is published. The RSS channel names itself with
//! `atom:link rel="self"`, as feed validators ask.
//!
//! The XML is written with quick-xml, which escapes every text and
//! attribute; the entries' HTML comes from an auto-escaping template. The
//! one thing neither does is drop the characters XML 1.0 forbids (control
//! characters, U+FFFE, U+FFFF), which [`xml_chars`] does before either sees
//! a string.

use super::Snapshot;
use bulkhead_control_api::IncidentView;
use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use serde::Serialize;
use std::borrow::Cow;

/// `GET /history.atom`.
pub(crate) fn atom(s: &Snapshot) -> String {
    let root = [
        ("xml:lang", "en-US"),
        ("xmlns", "http://www.w3.org/2005/Atom"),
    ];
    document("feed", &root, |w| {
        text(w, "id", &format!("tag:{},2005:/history", s.host()))?;
        let history = format!("{}/history.atom", s.url);
        empty(
            w,
            "link",
            &[
                ("rel", "alternate"),
                ("type", "text/html"),
                ("href", &s.url),
            ],
        )?;
        empty(
            w,
            "link",
            &[
                ("rel", "self"),
                ("type", "application/atom+xml"),
                ("href", &history),
            ],
        )?;
        text(w, "title", &title(s))?;
        text(w, "updated", &s.updated_at().to_string())?;
        open(w, "author", &[])?;
        text(w, "name", &s.name)?;
        close(w, "author")?;
        for i in &s.incidents {
            open(w, "entry", &[])?;
            text(w, "id", &format!("tag:{},2005:Incident/{}", s.host(), i.id))?;
            text(w, "published", &i.created_at.to_string())?;
            text(w, "updated", &i.updated_at.to_string())?;
            let url = s.incident_url(i.id);
            empty(
                w,
                "link",
                &[("rel", "alternate"), ("type", "text/html"), ("href", &url)],
            )?;
            text(w, "title", &i.name)?;
            w.write_event(Event::Start(
                BytesStart::new("content").with_attributes([("type", "html")]),
            ))?;
            w.write_event(Event::Text(BytesText::new(&content_html(i))))?;
            close(w, "content")?;
            close(w, "entry")?;
        }
        Ok(())
    })
}

/// `GET /history.rss`.
pub(crate) fn rss(s: &Snapshot) -> String {
    let root = [
        ("version", "2.0"),
        ("xmlns:dc", "http://purl.org/dc/elements/1.1/"),
        ("xmlns:atom", "http://www.w3.org/2005/Atom"),
    ];
    document("rss", &root, |w| {
        open(w, "channel", &[])?;
        let history = format!("{}/history.rss", s.url);
        empty(
            w,
            "atom:link",
            &[
                ("href", &history),
                ("rel", "self"),
                ("type", "application/rss+xml"),
            ],
        )?;
        text(w, "title", &title(s))?;
        text(w, "link", &s.url)?;
        text(w, "description", "Statuspage")?;
        text(w, "pubDate", &s.updated_at().rfc822())?;
        for i in &s.incidents {
            open(w, "item", &[])?;
            text(w, "title", &i.name)?;
            text(w, "description", &content_html(i))?;
            text(w, "pubDate", &i.created_at.rfc822())?;
            let url = s.incident_url(i.id);
            text(w, "link", &url)?;
            text(w, "guid", &url)?;
            close(w, "item")?;
        }
        close(w, "channel")?;
        Ok(())
    })
}

/// The HTML an entry carries, before XML escaping: the postmortem, then
/// the updates newest first.
pub(crate) fn content_html(i: &IncidentView) -> String {
    #[derive(Serialize)]
    struct Update<'a> {
        month: &'static str,
        day: u32,
        time: String,
        status: &'a str,
        body: Cow<'a, str>,
    }
    #[derive(Serialize)]
    struct Entry<'a> {
        postmortem: Option<Cow<'a, str>>,
        updates: Vec<Update<'a>>,
    }
    let entry = Entry {
        postmortem: i.postmortem_body.as_deref().map(xml_chars),
        updates: i
            .updates
            .iter()
            .map(|u| {
                let (month, day, time) = u.created_at.feed_parts();
                Update {
                    month,
                    day,
                    time,
                    status: u.status.label(),
                    body: xml_chars(&u.body),
                }
            })
            .collect(),
    };
    super::html::render("feed_entry.html", &entry)
}

/// `s` without the characters XML 1.0 forbids (they cannot be escaped,
/// only left out).
pub(crate) fn xml_chars(s: &str) -> Cow<'_, str> {
    let forbidden = |c: char| {
        ((c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r'))
            || matches!(c, '\u{FFFE}' | '\u{FFFF}')
    };
    if s.chars().any(forbidden) {
        Cow::Owned(s.chars().filter(|&c| !forbidden(c)).collect())
    } else {
        Cow::Borrowed(s)
    }
}

fn title(s: &Snapshot) -> String {
    format!("{} Status - Incident History", s.name)
}

/// The XML declaration and the document's root element, opened.
fn open(w: &mut Writer<Vec<u8>>, name: &str, attrs: &[(&str, &str)]) -> std::io::Result<()> {
    w.write_event(Event::Start(start_tag(name, attrs)))
}

fn empty(w: &mut Writer<Vec<u8>>, name: &str, attrs: &[(&str, &str)]) -> std::io::Result<()> {
    w.write_event(Event::Empty(start_tag(name, attrs)))
}

fn start_tag<'a>(name: &'a str, attrs: &[(&str, &str)]) -> BytesStart<'a> {
    let mut start = BytesStart::new(name);
    for &(k, v) in attrs {
        start.push_attribute((k, xml_chars(v).as_ref()));
    }
    start
}

fn text(w: &mut Writer<Vec<u8>>, name: &str, value: &str) -> std::io::Result<()> {
    w.write_event(Event::Start(BytesStart::new(name)))?;
    w.write_event(Event::Text(BytesText::new(&xml_chars(value))))?;
    close(w, name)
}

fn close(w: &mut Writer<Vec<u8>>, name: &str) -> std::io::Result<()> {
    w.write_event(Event::End(BytesEnd::new(name)))
}

/// The XML document whose root element `name` (with `attrs`) holds what
/// `body` writes, newline-terminated. Writing to memory cannot fail; were it
/// to, the feed would be empty, not cut.
fn document(
    name: &str,
    attrs: &[(&str, &str)],
    body: impl FnOnce(&mut Writer<Vec<u8>>) -> std::io::Result<()>,
) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let written = w
        .write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))
        .and_then(|()| open(&mut w, name, attrs))
        .and_then(|()| body(&mut w))
        .and_then(|()| close(&mut w, name));
    if let Err(e) = written {
        tracing::error!(error = %e, "status feed could not be written");
        return String::new();
    }
    let mut xml = String::from_utf8(w.into_inner()).unwrap_or_default();
    xml.push('\n');
    xml
}
