mod contract;
mod props;
mod reload;
