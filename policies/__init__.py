"""Network families (``embodied.policies``): one file each."""
