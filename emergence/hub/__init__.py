"""The Hugging Face Hub as it is: the endpoint (``endpoint``), revision names and discovery
(``revisions``), checkpoint resolution and safe loading (``checkpoints``), weight formats and
downloads (``weights``) and the branch integrity check (``integrity``)."""
