"""Joint geometry: one draw of crop, flips and rot90 applied to every field of a sample, by role
(the kernel registry)."""
