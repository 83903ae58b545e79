"""_table: the table job (`run_table`, `TableProcessor`): a table in, the same table with each row's answer out."""
