"""One module per section of paper/dspark.md, each appending its text to the page being built."""
