//! The rendered lines written out for each kind of receiver: chat-robot markdown (with
//! upstream text made inert), plain text and HTML mail.

use super::Line;

pub(super) fn markdown(title: &str, lines: &[Line]) -> String {
    let mut out = format!("### {title}\n\n");
    for l in lines {
        match l {
            Line::Field(k, v) => out.push_str(&format!("**{k}**: {}\n\n", md_text(v))),
            Line::Link(k, url) => out.push_str(&format!("**{k}**: [{url}]({url})\n\n")),
            Line::Bullet(s, Some(url)) => out.push_str(&format!("- [{}]({url})\n", md_text(s))),
            Line::Bullet(s, None) => out.push_str(&format!("- {}\n", md_text(s))),
            Line::Para(s) => out.push_str(&format!("\n{}\n\n", md_text(s))),
        }
    }
    out.trim_end().to_owned()
}

/// Text that reaches a chat robot's markdown — upstream error messages, reported model names,
/// drift examples — made inert: no link, image, HTML or `<at …>` mention can be formed from
/// it, whatever an upstream answers. The robots' markdown dialects have no reliable escape
/// character, so the few characters that build those are swapped for look-alikes.
pub(super) fn md_text(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '[' => '［',
            ']' => '］',
            '<' => '‹',
            '>' => '›',
            '`' => 'ˋ',
            '*' => '∗',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

pub(super) fn text(title: &str, lines: &[Line]) -> String {
    let mut out = format!("{title}\n\n");
    for l in lines {
        match l {
            Line::Field(k, v) | Line::Link(k, v) => out.push_str(&format!("{k}: {v}\n")),
            Line::Bullet(s, Some(url)) => out.push_str(&format!("  - {s}\n    {url}\n")),
            Line::Bullet(s, None) => out.push_str(&format!("  - {s}\n")),
            Line::Para(s) => out.push_str(&format!("{s}\n\n")),
        }
    }
    out
}

pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(super) fn html(title: &str, lines: &[Line]) -> String {
    let mut out = format!("<h3>{}</h3>\n", esc(title));
    let mut in_list = false;
    for l in lines {
        let bullet = matches!(l, Line::Bullet(..));
        if bullet && !in_list {
            out.push_str("<ul>\n");
            in_list = true;
        } else if !bullet && in_list {
            out.push_str("</ul>\n");
            in_list = false;
        }
        match l {
            Line::Field(k, v) => out.push_str(&format!("<p><b>{}</b>: {}</p>\n", esc(k), esc(v))),
            Line::Link(k, url) => out.push_str(&format!(
                "<p><b>{}</b>: <a href=\"{u}\">{u}</a></p>\n",
                esc(k),
                u = esc(url)
            )),
            Line::Bullet(s, Some(url)) => out.push_str(&format!(
                "<li><a href=\"{}\">{}</a></li>\n",
                esc(url),
                esc(s)
            )),
            Line::Bullet(s, None) => out.push_str(&format!("<li>{}</li>\n", esc(s))),
            Line::Para(s) => out.push_str(&format!("<p>{}</p>\n", esc(s))),
        }
    }
    if in_list {
        out.push_str("</ul>\n");
    }
    out
}
