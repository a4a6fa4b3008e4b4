"""The real models the areas run on ranks: FSDP + TP (:mod:`.fsdp`) and TorchRec
(:mod:`.torchrec`)."""
