//! The Workers AI task names the platform acts on: a model's task decides
//! whether it generates or embeds (the gateway routes by it, the prober
//! probes by it, `up` publishes with it).

/// The task of the models that generate text.
pub const GENERATION_TASK: &str = "Text Generation";

/// The task of the models that embed text (and generate nothing).
pub const EMBEDDING_TASK: &str = "Text Embeddings";

/// Whether a model of `task` embeds.
pub fn is_embedding(task: &str) -> bool {
    task.eq_ignore_ascii_case(EMBEDDING_TASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_embedding_task_embeds() {
        assert!(is_embedding("Text Embeddings"));
        assert!(is_embedding("text embeddings"));
        assert!(!is_embedding(GENERATION_TASK));
        assert!(!is_embedding(""));
    }
}
