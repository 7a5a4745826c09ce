"""What shows analyses and runs to people: the HTML report (`report`), the figures (`plots`, and `figures` for seed
002's analyses) and the readers table's display rows and files (`readers_table`). It reads tracking/analysis and
tracking/store; tracking/analysis never imports it (computation does not know how it is shown). Below mlflow."""
