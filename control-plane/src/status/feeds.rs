//! The incident history as Atom and RSS 2.0, in the shape of Statuspage's
//! `/history.atom` and `/history.rss`: one entry per incident, newest first,
//! whose HTML content lists the updates newest first, each as
//! `<p><small>date</small><br><strong>Status</strong> - body</p>`, after the
//! postmortem when one is published. The RSS channel names itself with
//! `atom:link rel="self"`, as feed validators ask.

use super::{Snapshot, escape};
use bulkhead_control_api::IncidentView;
use std::fmt::Write;

/// `GET /history.atom`.
pub(crate) fn atom(s: &Snapshot) -> String {
    let title = format!("{} Status - Incident History", s.name);
    let mut x = String::new();
    x.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str("<feed xml:lang=\"en-US\" xmlns=\"http://www.w3.org/2005/Atom\">\n");
    let _ = writeln!(x, "  <id>tag:{},2005:/history</id>", escape(s.host()));
    let _ = writeln!(
        x,
        "  <link rel=\"alternate\" type=\"text/html\" href=\"{}\"/>",
        escape(&s.url)
    );
    let _ = writeln!(
        x,
        "  <link rel=\"self\" type=\"application/atom+xml\" href=\"{}/history.atom\"/>",
        escape(&s.url)
    );
    let _ = writeln!(x, "  <title>{}</title>", escape(&title));
    let _ = writeln!(x, "  <updated>{}</updated>", s.updated_at());
    let _ = writeln!(
        x,
        "  <author>\n    <name>{}</name>\n  </author>",
        escape(&s.name)
    );
    for i in &s.incidents {
        x.push_str("  <entry>\n");
        let _ = writeln!(
            x,
            "    <id>tag:{},2005:Incident/{}</id>",
            escape(s.host()),
            i.id
        );
        let _ = writeln!(x, "    <published>{}</published>", i.created_at);
        let _ = writeln!(x, "    <updated>{}</updated>", i.updated_at);
        let _ = writeln!(
            x,
            "    <link rel=\"alternate\" type=\"text/html\" href=\"{}\"/>",
            escape(&s.incident_url(i.id))
        );
        let _ = writeln!(x, "    <title>{}</title>", escape(&i.name));
        let _ = writeln!(
            x,
            "    <content type=\"html\">{}</content>",
            escape(&content_html(i))
        );
        x.push_str("  </entry>\n");
    }
    x.push_str("</feed>\n");
    x
}

/// `GET /history.rss`.
pub(crate) fn rss(s: &Snapshot) -> String {
    let title = format!("{} Status - Incident History", s.name);
    let mut x = String::new();
    x.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(
        "<rss version=\"2.0\" xmlns:dc=\"http://purl.org/dc/elements/1.1/\" xmlns:atom=\"http://www.w3.org/2005/Atom\">\n  <channel>\n",
    );
    let _ = writeln!(
        x,
        "    <atom:link href=\"{}/history.rss\" rel=\"self\" type=\"application/rss+xml\"/>",
        escape(&s.url)
    );
    let _ = writeln!(x, "    <title>{}</title>", escape(&title));
    let _ = writeln!(x, "    <link>{}</link>", escape(&s.url));
    x.push_str("    <description>Statuspage</description>\n");
    let _ = writeln!(x, "    <pubDate>{}</pubDate>", s.updated_at().rfc822());
    for i in &s.incidents {
        x.push_str("    <item>\n");
        let _ = writeln!(x, "      <title>{}</title>", escape(&i.name));
        let _ = writeln!(
            x,
            "      <description>{}</description>",
            escape(&content_html(i))
        );
        let _ = writeln!(x, "      <pubDate>{}</pubDate>", i.created_at.rfc822());
        let _ = writeln!(x, "      <link>{}</link>", escape(&s.incident_url(i.id)));
        let _ = writeln!(x, "      <guid>{}</guid>", escape(&s.incident_url(i.id)));
        x.push_str("    </item>\n");
    }
    x.push_str("  </channel>\n</rss>\n");
    x
}

/// The HTML an entry carries, before XML escaping: updates newest first.
pub(crate) fn content_html(i: &IncidentView) -> String {
    let mut h = String::new();
    if let Some(pm) = &i.postmortem_body {
        let _ = write!(h, "<p><strong>Postmortem</strong> - {}</p>", escape(pm));
    }
    for u in &i.updates {
        let (month, day, time) = u.created_at.feed_parts();
        let _ = write!(
            h,
            "<p><small>{month} <var data-var='date'>{day}</var>, <var data-var='time'>{time}</var> UTC</small><br><strong>{}</strong> - {}</p>",
            u.status.label(),
            escape(&u.body)
        );
    }
    h
}
