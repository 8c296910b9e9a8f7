"""Pure pandas on artifacts: categories, trace and result tables. No torch, no triton."""
