"""The in-job agent on the frameworks users train with, as those frameworks want it: PyTorch Lightning's callback
(:mod:`chaos.integrations.lightning`, imports Lightning only when used). torchft and FSDP need no adapter of their
own: ``chaos.agent.attach`` takes them (:mod:`chaos.guards.torchft`, :mod:`chaos.injob.fsdp`)."""
