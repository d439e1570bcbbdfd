"""The policy: model loading (Hugging Face id, local directory or the bundled default) and
generation backends behind one small interface."""
