//! Chat templates: the model's own Jinja template, rendered with minijinja.

use crate::error::LoadError;
use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
}

/// A template failed to render (for example it raised an exception).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot render the chat template: {0}")]
pub struct TemplateError(String);

impl ChatTemplate {
    pub(crate) fn new(source: &str, bos: String, eos: String) -> Result<Self, LoadError> {
        let mut env = Environment::new();
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| LoadError::ChatTemplate(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            bos,
            eos,
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`, ending with the assistant's turn opener.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| TemplateError(e.to_string()))
    }
}
