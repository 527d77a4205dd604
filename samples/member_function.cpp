// Wrapping a member function: `{0}` is the first declared parameter, the
// object comes first in the call and is used by reference.
//
//   LOCKWATCH_STORE_URL=redis://127.0.0.1:6379 ./lockwatch-sample-member
#include <lockwatch/lockwatch.hpp>

#include <cstdio>

using namespace std::chrono_literals;

class Account {
 public:
  long withdraw(int id, long amount) {
    if (lockwatch::this_lease().stop_token().stop_requested()) throw std::runtime_error("lease lost");
    balance_ -= amount;
    std::printf("account %d: -%ld, balance %ld\n", id, amount, balance_);
    return balance_;
  }

 private:
  long balance_ = 1000;
};

int main() {
  Account account;
  auto withdraw = LOCKED("acct:{0}", 2s, lockwatch::forever) &Account::withdraw;
  try {
    withdraw(account, 7, 100).get();
    long left = withdraw(account, 7, 250).get();
    return left == 650 ? 0 : 1;
  } catch (const lockwatch::Error& e) {
    std::fprintf(stderr, "withdraw failed: %s\n", e.what());
    return 1;
  }
}
