mod contract;
mod embeddings;
mod props;
mod reload;
