"""The sequential drafter: one small decoder layer drafting depth after depth (EAGLE-style)."""
